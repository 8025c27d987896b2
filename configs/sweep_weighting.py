"""Duration weighting and step size in the real loop (issue 11): configs/task.py with the
duration weight that corrects the arrival bias the run actually has, on the learning check's
seeds (configs/learning_check.py: 2, 3, 4; its "default" is the paper's batch_mean weight).

With bounded admission nothing finished is discarded, so every started episode is trained and
the trained set is an unbiased draw of the policy (report.md, "Arrival bias": slope ~0, p̂ = 1).
Δt/mean(Δt) weights then only tilt the gradient towards slow episodes: a syntax error or an
empty code block returns in ~3 s against ~13 s for a valid program (food-reviews, seeds 2-4),
so the failures RL must remove get a quarter of a valid program's weight. The toy
(docs/duration_bias) measured the same tilt: under admission@0 batch_mean unlearns a fast
failure 2.6x slower than weights of 1/p̂ ("inverse_inclusion", which is 1 here, and
corrects by the measured loss where slow episodes are lost).

Measured (docs/learning_check/results_v5.md): the hypothesis did not hold. The paper's weight
learned more (batch-reward gain +2.26 vs +1.34, valid-rate gain +0.21 vs +0.16 over seeds 2-4),
so configs/task.py keeps batch_mean.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_weighting.py --workdir workdirs/sweep_weighting
"""

import ml_collections

from configs.sweep_base import sweep_config

INCLUSION = (("learner.duration_weighting", "inverse_inclusion"),)

VARIANTS = {
    "default": (),  # the paper's batch_mean, for a comparison within one run of the machine
    "inverse_inclusion": INCLUSION,
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
