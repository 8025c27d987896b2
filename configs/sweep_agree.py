"""Entropy minimisation only where it agrees with the policy gradient (learner.entropy_agree)
against the default's gated term, on food-reviews seeds 11-13: the seeds of the weakest
food-reviews check of the default (docs/learning_check/results_food_s11.md), where most of the
last quarter's failures were one improve line the warm start writes broken at p ~0.99
(`GridSearchCV(LogisticRegression(max_iter=1)` + newline) and the gated term made surer
(scripts/analyse_entropy_positions.py --kind improve --error_line).

Launch (resumes; ~9 min per run, 2 cores, nothing else running; the initial best-of-32 of
workdirs/lc_food_s11 is the same key and draws, copy its _initial_evals to skip them):
  python experiments/sweep.py --config configs/sweep_agree.py --workdir workdirs/sweep_agree

`flip` reverses the term where `agree` leaves it out (learner.entropy_disagree=-1): there it
raises the entropy, so at a confident mistake it pushes with the policy gradient instead of
against it (--variants flip runs it alone beside finished runs).

Other tasks and seeds (docs/sweep_agree/results_*.md), then the two variants seed by seed:
  python experiments/sweep.py --config configs/sweep_agree.py --config.seeds="(14,15,16)" \
      --workdir workdirs/sweep_agree_food2
  python experiments/sweep.py --config configs/sweep_agree.py:telco-churn \
      --config.seeds="(2,3,4)" --workdir workdirs/sweep_agree_telco
  python scripts/compare_variants.py --a agree workdirs/sweep_agree workdirs/sweep_agree_food2 \
      workdirs/sweep_agree_telco
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"agree": (("learner.entropy_agree", True),),
                         "flip": (("learner.entropy_agree", True),
                                  ("learner.entropy_disagree", -1.0)),
                         "default": ()},
                        seeds=(11, 12, 13), arg=arg)
