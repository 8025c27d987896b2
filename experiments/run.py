"""Train a policy with asynchronous PPO on one MLE task.

  python experiments/run.py --config configs/task.py [--config.KEY=VALUE ...] [--workdir DIR]

Unknown keys and bad values fail before any work starts. Re-running with the same workdir
resumes from its last checkpoint.
"""

import json
import logging
import sys
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax.train import train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default: workdirs/<task>).")
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
    summary = train(config, workdir)
    print(json.dumps({k: summary[k] for k in ("workdir", "report", "initial", "final")
                      if k in summary}, indent=1, default=str))


if __name__ == "__main__":
    app.run(main)
