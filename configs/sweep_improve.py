"""The self-improvement share for the tiny model (issue 11, point 2: "improve share" was not yet
swept). configs/task.py (8 slots, run reuse 4) with `run.improve_prob` 0.5 (the paper's, the
default), 0.25 and 0, on the sweep's seeds 0 and 1; confirm a winner on the learning check's
seeds 2-4 (configs/learning_check.py) before changing the default. Why: late in a run most
failures come from improve episodes (their prompt is ~507 of 512 tokens, the parent's code
trimmed), so the share may trade self-improvement against the valid rate.
Measured (docs/sweep_improve/results.md, README "Hyper-parameters of the tiny model"): the
default 0.5 had the largest valid-rate gain; no winner to confirm, the default stays.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_improve.py --workdir workdirs/sweep_improve
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "improve_half": (),  # the default
    "improve_quarter": (("run.improve_prob", 0.25),),
    "improve_none": (("run.improve_prob", 0.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(0, 1), arg=arg)
