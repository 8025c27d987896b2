"""Compile-ahead only where it pays (run.precompile_payback=1, the default since 2026-12-07)
against compiling every likely batch shape ahead (0, the default before): learner steps in the
300 s budget, and the learning check's numbers at the new default, on seeds no setting was
chosen on (titanic-survival 8-10).

Each variant in its own process with its own empty JAX compilation cache (a fresh machine's
first run, where a compile costs 15-55 s on 2 cores; later seeds of a process find the first
seed's programs in memory, alike for both variants). Launch (resumes; ~10 min per run, 2 cores,
nothing else running):
  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  RL4MLE_JAX_CACHE=workdirs/jax_cache_payback python experiments/sweep.py \\
      --config configs/sweep_payback.py:/work/tasks/titanic-survival \\
      --workdir workdirs/sweep_payback --variants payback
  RL4MLE_JAX_CACHE=workdirs/jax_cache_always python experiments/sweep.py \\
      --config configs/sweep_payback.py:/work/tasks/titanic-survival \\
      --workdir workdirs/sweep_payback --variants always
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"payback": (("run.precompile_payback", 1.0),),
                         "always": (("run.precompile_payback", 0.0),)},
                        seeds=(8, 9, 10), arg=arg)
