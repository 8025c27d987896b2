"""Train a policy with asynchronous PPO on one MLE task.

  python experiments/run.py --config configs/task.py [--config.KEY=VALUE ...] [--workdir DIR]

Unknown keys and bad values fail before any work starts. Re-running with the same workdir
resumes from its last checkpoint.

Several JAX processes (hosts): start the same command on each, with RL4MLE_COORDINATOR /
RL4MLE_NUM_PROCESSES / RL4MLE_PROCESS_ID set, or with --distributed where JAX finds the
cluster itself (TPU pod slice, SLURM). Process 0 runs the loop; the others mirror its learner
steps (rl4mle_jax/spmd.py). The workdir must be the same shared directory on every host.
"""

import json
import logging
import os
import sys
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from rl4mle_jax import compile_cache, distributed, spmd  # noqa: E402
from rl4mle_jax.train import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default: workdirs/<task>).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Join a JAX process group found by JAX itself (TPU pod slice, SLURM); "
    "implied by RL4MLE_COORDINATOR.")
flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Our own log lines at INFO; the libraries' (orbax, jax) only from WARNING up.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()  # $RL4MLE_JAX_CACHE; a rerun loads its programs from disk
    config = _CONFIG.value
    workdir = Path(_WORKDIR.value or f"workdirs/{Path(str(config.task)).name}")
    if (_DISTRIBUTED.value or os.environ.get(distributed.ENV[0])) and distributed.initialize():
        import jax

        if jax.process_index() != 0:
            spmd.follow(config, workdir)
            return
    summary = train(config, workdir)
    print(json.dumps({k: summary[k] for k in ("workdir", "report", "initial", "final")
                      if k in summary}, indent=1, default=str))


if __name__ == "__main__":
    app.run(main)
