"""The default with twice the RL time (issue 11): does the valid rate keep rising after 300 s?

Every configuration tried on food-reviews (docs/sweep_anchor and the sweeps before it) ends its
300 s at a best-of-32 valid rate of ~0.9 from ~0.7, and the trained batches' valid rate
flattens in the second half of the run. This runs configs/task.py with run.time_budget_s=600 on
the learning check's seeds and initial draws (copy workdirs/sweep_anchor/_initial_evals into
the workdir to reuse them; the initial evaluation's key leaves out the run section), to say
whether the 300 s budget or the method is what stops the gain at ~0.2.

Measured at 45e20f7 with whitened advantages, the default then (configs/task.py has
unwhitened them since: docs/sweep_whiten).

Launch (resumes; ~13 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_budget.py --workdir workdirs/sweep_budget
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "rl600s": (("run.time_budget_s", 600.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
