"""Best-of-N evaluation (solve and improve candidates) of a trained run or a Hugging Face dir.

  python experiments/evaluate.py --workdir workdirs/task [--n 16]
  python experiments/evaluate.py --hf_dir /path/to/model --config configs/task.py --n 16

The pick follows the config's `run.eval_pick` (with --workdir: the run's own; "cv" runs the
finalists on selection splits too, best_of_n.select_pick) and its test-split score is
reported, with the reward split's maximum beside it; the paper's protocol (best test score of N)
is reported beside them, labelled as such.
"""

import json
import sys
from pathlib import Path

import jax
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from configs import task as task_config  # noqa: E402
from rl4mle_jax import checkpoint as ckpt_lib  # noqa: E402
from rl4mle_jax import compile_cache, sharding  # noqa: E402
from rl4mle_jax.best_of_n import best_of_n, save_eval  # noqa: E402
from rl4mle_jax.components import build_components  # noqa: E402
from rl4mle_jax.report import brief_eval  # noqa: E402
from rl4mle_jax.rl.learner import make_learner  # noqa: E402
from rl4mle_jax.sampling import truncation_settings  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir (its latest checkpoint).")
_HF_DIR = flags.DEFINE_string("hf_dir", None, "Or: a Hugging Face directory to evaluate.")
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (with --hf_dir).")
_N = flags.DEFINE_integer("n", 16, "Candidates (half solve, half improve-the-best).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


def main(argv):
    del argv
    compile_cache.enable()
    if bool(_WORKDIR.value) == bool(_HF_DIR.value):
        raise app.UsageError("give exactly one of --workdir or --hf_dir")
    if _WORKDIR.value:
        workdir = Path(_WORKDIR.value)
        # The run's own settings over today's defaults (keys added since the run get defaults).
        config = task_config.get_config()
        config.update(json.loads((workdir / "config.json").read_text()))
        comps = build_components(config, workdir)
        learner = make_learner(comps.model_config, dict(config.learner),
                               sharding.make_meshes(**config.mesh).learner)
        with ckpt_lib.CheckpointManager(workdir / "checkpoints") as mngr:
            state, meta = mngr.restore(learner.abstract_state())
        params, out = state.policy_params, workdir / f"eval_step{meta['step']}.json"
    else:
        if _CONFIG.value is None:
            raise app.UsageError("--hf_dir needs --config (e.g. configs/qwen2_5_3b.py)")
        config = _CONFIG.value
        config.model.hf_dir = _HF_DIR.value
        config.warmstart.enabled = False
        workdir = Path(_HF_DIR.value)
        comps = build_components(config, workdir)
        params, out = comps.params, Path("eval_" + Path(_HF_DIR.value).name + ".json")
    result = best_of_n(comps, params, _N.value, jax.random.PRNGKey(_SEED.value),
                       config.sampling.temperature, config.run.slots, config.run.reuse_runs,
                       truncation_settings(config.sampling),  # sampled as in training
                       config.run.eval_pick, config.run.eval_select_folds,
                       config.run.eval_finalist_se, config.run.eval_finalists)
    save_eval(result, out)
    print(json.dumps({"written": str(out), **brief_eval(result),
                      "pick_rule": result.get("pick", {}).get("rule"),
                      "reward_max_pick_test_score": result.get("pick_max", {}).get("test_score")},
                     indent=1))


if __name__ == "__main__":
    app.run(main)
