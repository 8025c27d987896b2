"""Entropy minimisation on top of the leave-one-out default (issue 11), seeds 5-7.

What the default leaves after 300 s is a floor of ~10% failed trained episodes on food-reviews
(~12-20% on telco-churn), most of them syntax errors: garbles of the 1.3M-parameter model at
T = 0.7, each at its own position and token (docs/sweep_budget: the trained batches hold ~0.88
valid from ~150 s on). The policy gradient reaches such a garble only through the one sampled
token of the one failed episode, so it removes systematic mistakes (wrong keyword arguments:
runtime errors fall from ~20 to ~4 per quarter on telco-churn) but not a tail spread over every
position. A negative entropy coefficient (loss + |c| * token entropy) sharpens every position
of every trained episode at once, the tail included (entropy minimisation as a learning signal:
Agarwal et al. 2025, "The Unreasonable Effectiveness of Entropy Minimization in LLM Reasoning").

Measured (docs/sweep_entropy/results.md; food-reviews seeds 5-7 here, telco-churn seeds 2-4 with
`:telco-churn --config.seeds="(2,3,4)" --variants ent_m0p5_rank,ent_m2_rank` in workdirs/lc_telco):
-0.5 with the rank bonus gained reward +1.69 / +1.89 and valid rate +0.28 / +0.14 against
+1.26 / +1.78 and +0.23 / +0.10 without either, pick unchanged; -0.5 alone lost one seed's
pick (0.8755 -> 0.8334); -2 with the bonus did as well on average with fewer distinct programs.
configs/task.py takes -0.5 with the rank bonus.

Launch (resumes; ~7-9 min per run on 2 cores; in the learning check's workdir to reuse its
initial draws; its `rloo` variant, configs/sweep_rloo.py's, is configs/task.py as it was before
this sweep):
  python experiments/sweep.py --config configs/sweep_entropy.py --workdir workdirs/lc567
"""

import ml_collections

from configs.sweep_base import sweep_config

# Every position, as measured here (configs/task.py gates the term since docs/sweep_gate).
GATE_OFF = ("learner.entropy_gate", 0.0)
NO_BONUS = ("run.rank_bonus", 0.0)  # configs/task.py has the bonus since this sweep
VARIANTS = {
    "ent_m0p05": (("learner.entropy_coef", -0.05), NO_BONUS, GATE_OFF),
    "ent_m0p5": (("learner.entropy_coef", -0.5), NO_BONUS, GATE_OFF),
    "ent_m2": (("learner.entropy_coef", -2.0), NO_BONUS, GATE_OFF),
    # The sharpening also removes rare choices, the best program among them when the reward
    # cannot tell it from the others (a valid AUC of 0.83 vs 0.88 against -10 for a failure):
    # run.rank_bonus gives the batch's better valid programs the larger push.
    "ent_m0p5_rank": (("learner.entropy_coef", -0.5), ("run.rank_bonus", 1.0), GATE_OFF),
    "ent_m2_rank": (("learner.entropy_coef", -2.0), ("run.rank_bonus", 1.0), GATE_OFF),
}
# -0.05 barely moved the entropy on seed 5 (0.037 -> 0.030; its gradient norm ~0.01 against ~1
# for a batch with a failure), so it ran on one seed only.
VARIANT_SEEDS = {"ent_m0p05": (5,)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg, variant_seeds=VARIANT_SEEDS)
