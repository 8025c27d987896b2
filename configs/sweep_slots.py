"""More episode slots: run.slots 12 (configs/task.py's since this sweep) against 8, the earlier
default, whose runs on the same seeds are docs/learning_check/results_v6.md (issue 11, learner
steps per 300 s).

On 2 cores ~70% of the default's episodes reuse an earlier identical program's run (they wait
out its time without using a core), so the slots, not the cores, may bound how many episodes
finish. Same seeds and initial draws as configs/learning_check.py.

Launch (resumes; ~8.5 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_slots.py --workdir workdirs/sweep_slots
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"slots12": (("run.slots", 12),)}, seeds=(2, 3, 4), arg=arg)
