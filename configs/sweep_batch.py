"""More updates from the same episodes on slow tasks (issue 11): `run.batch_size`, seeds 2-4.

Where programs take ~10 s (diamonds-cut, leaf-species, email-spam) a 300 s run trains on
150-270 episodes, 17-33 learner steps of 8, and the valid-rate goal was missed on all three
(+0.17 / +0.06 / +0.15; docs/learning_check). The learner's cost is per token, so batches of
4 make about twice the updates from the same episodes at about the same learner CPU; Adam's
step is per update, so the policy moves about twice as far, on noisier estimates (each
leave-one-out baseline is the mean of three rows, the rank bonus ranks within four).

Launch (resumes; ~9 min per run on 2 cores; in the learning checks' workdirs, to reuse the
default's warm starts and initial draws and compare with its rows there):
  python experiments/sweep.py --config configs/sweep_batch.py:diamonds-cut \
      --workdir workdirs/lc_dcut
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "b4": (("run.batch_size", 4),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
