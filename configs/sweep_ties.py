"""The rank bonus without ranking noise (issue 11): `run.rank_tie_se`, seeds 2-4.

The default's rank bonus (`run.rank_bonus=1`) gives every valid row of a learner batch its
centred rank among the batch's valid rows, so a reward-split gap of 0.001 AUC is a whole rank.
On titanic-survival (209 reward rows, a standard error of ~0.03 AUC) the policy concentrated on
the program with the best reward-split mean, and the test pick lost 0.019 on one seed of three;
on diamonds-price one seed's final pick was better on the reward split and worse on test
(docs/learning_check). `run.rank_tie_se=1` makes a pair whose gap is within one standard error
of their score difference a tie (a paired bootstrap: the grader scores every submission on the
same 64 resamples of the split's rows, `GradeReport.score_boot`), so the bonus ranks only what
the reward split can resolve.

Measured (docs/sweep_ties/results.md): on titanic-survival the policy concentrated on GaussianNB
as before and the pick lost on two seeds instead of one; on food-reviews the reward gain was
+1.16 against the default's +1.78. Not adopted.

Launch (resumes; ~8 min per run on 2 cores; in the learning checks' workdirs, to reuse the
default's initial draws and compare with its rows there):
  python experiments/sweep.py --config configs/sweep_ties.py:/work/tasks/titanic-survival \
      --workdir workdirs/lc_titanic
  python experiments/sweep.py --config configs/sweep_ties.py:diamonds-price \
      --workdir workdirs/lc_diamonds
  python experiments/sweep.py --config configs/sweep_ties.py --config.seeds="(5,6,7)" \
      --workdir workdirs/lc567
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "ties1": (("run.rank_tie_se", 1.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
