"""Failure credit under the leave-one-out default (issue 11).

docs/sweep_credit measured `learner.failure_credit="error_line"` (a syntax error's advantage on
the tokens of the line the parser names, rollout/credit.py) against the GAE default of the day,
with whitened advantages. Under the leave-one-out baseline, unwhitened (configs/task.py since
then), the two credits differ in one more way: with "sequence" a failure's push down on the
~240 tokens it shares with the batch's valid programs cancels their push up; with
"error_line" it does not, so every batch with a syntax error also sharpens the copied tokens.
In the last quarter of the default's runs most failures left are improve candidates that start
a line the model cannot finish (`GridSearchCV(LogisticRegression(max_iter=1000), {"C": [0.5,`
then garbles): the line's first tokens are the branch the credit puts the push on.

Launch (resumes; ~8 min per run on 2 cores; in the learning check's workdir the `rloo`
variant of configs/sweep_rloo.py is the default on the same seeds, warm start and draws):
  python experiments/sweep.py --config configs/sweep_credit_rloo.py --workdir workdirs/lc567
  python experiments/sweep.py --config configs/sweep_credit_rloo.py:digits \
      --config.seeds="(2,3,4)" --workdir workdirs/lc_digits
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "rloo_error_line": (("learner.failure_credit", "error_line"),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
