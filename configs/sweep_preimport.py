"""Programs forked from a pre-imported interpreter (env.preimport, sandbox/zygote.py, now the
default) against fresh interpreters: what the loop does with the CPU the programs' imports took.

A fresh program spends ~2.6 of its ~3.4 CPU-s importing pandas and scikit-learn
(scripts/bench_program_imports.py); forked from the zygote the machine spends 0.91 CPU-s per run
instead of 3.47 (titanic-survival, 8 programs of a default run). Seed by seed in one process,
on the same warm start and initial draws as configs/learning_check.py's titanic-survival seeds
5-7.

Launch (resumes; ~9 min per run on 2 cores; root, for the zygote):
  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  python experiments/sweep.py --config configs/sweep_preimport.py:/work/tasks/titanic-survival \\
      --workdir workdirs/sweep_preimport
"""

import ml_collections

from configs.sweep_base import sweep_config
from configs.task import PREIMPORT


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    # "default": fresh interpreters, the default when this sweep ran (commit ef980fb); both
    # variants are explicit so that a re-run compares the same two.
    return sweep_config({"preimport": (("env.preimport", PREIMPORT),),
                         "default": (("env.preimport", ""),)}, seeds=(5, 6, 7), arg=arg)
