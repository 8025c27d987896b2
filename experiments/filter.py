"""The solvability filter over tasks: N zero-shot samples each, run, graded, keep or drop.

  python experiments/filter.py --tasks food-reviews,telco-churn --n 128 --workdir workdirs/filter
  python experiments/filter.py --tasks food-reviews telco-churn /data/my_task --n 32 ...
  python experiments/filter.py --config configs/qwen2_5_3b.py:/path/to/Qwen2.5-3B-Instruct \
      --tasks spooky-author-identification --workdir workdirs/filter_3b

Tasks are local suite ids, task directories or MLE-bench ids (`--tasks all`: the local suite).
The policy is whatever the config starts RL from: with `configs/task.py` (the default) each
task's cached warm start of the tiny model (built if missing; it is fine-tuned on that task's
demonstrations, so its numbers say how well RL can start, not what zero-shot means for a real
model), with `model.hf_dir` the given checkpoint for every task. Writes `filter.json`,
`filter.md` and `filter.png` into --workdir (and each task's samples under <workdir>/<task>/);
a rerun resumes and only samples what is missing.
"""

import hashlib
import json
import logging
import re
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax import filter as filter_lib  # noqa: E402
from rl4mle_jax.components import build_components  # noqa: E402
from rl4mle_jax.env import mlebench  # noqa: E402
from rl4mle_jax.env import tasks as tasks_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(Path(__file__).resolve().parents[1] / "configs" / "task.py"),
    "Config whose policy is filtered (default: the embedded CPU default).")
_TASKS = flags.DEFINE_list("tasks", None, "Task ids or directories (comma- or space-separated; "
                           "'all': the local suite).")
_N = flags.DEFINE_integer("n", 128, "Zero-shot samples per task (the paper: 128).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "Sampling temperature (the paper: 0.7).")
_GROUP = flags.DEFINE_integer("group_size", 8, "G of the separation statistic.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_MIN_VALID = flags.DEFINE_integer("min_valid", 1, "Keep: at least this many valid samples.")
_MIN_SEP = flags.DEFINE_float("min_separation", 0.0, "Keep: separation at least this.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where samples and tables go.")


def _task_dir_name(task_id: str, source: str) -> str:
    """One directory per task source: a suite id is its own name, a path gets a short hash."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)
    if Path(source).expanduser().is_dir():
        safe += "-" + hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:8]
    return safe


def main(argv):
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    compile_cache.enable()
    sources = list(_TASKS.value or []) + list(argv[1:])  # `--tasks a b c` leaves b, c in argv
    if sources == ["all"]:
        sources = tasks_lib.list_tasks()
    if not sources or not _WORKDIR.value:
        raise app.UsageError("give --tasks and --workdir")
    workdir = Path(_WORKDIR.value)
    workdir.mkdir(parents=True, exist_ok=True)
    rule = filter_lib.FilterRule(_MIN_VALID.value, _MIN_SEP.value)
    result = {"n": _N.value, "temperature": _TEMPERATURE.value, "group_size": _GROUP.value,
              "seed": _SEED.value, "rule": rule.describe(), "command": " ".join(sys.argv),
              "tasks": []}
    bar = tqdm(total=_N.value * len(sources), desc="filter", unit="sample", dynamic_ncols=True)
    for source in sources:
        config = _CONFIG.value.copy_and_resolve_references()
        config.task = source
        bar.set_postfix(task=source)
        try:
            comps = build_components(config, workdir)
            entry = filter_lib.filter_task(
                comps, workdir / _task_dir_name(comps.task.id, source), n=_N.value,
                temperature=_TEMPERATURE.value, seed=_SEED.value, group_size=_GROUP.value,
                concurrency=config.run.slots, rule=rule, progress=bar.update)
            comps.sandbox.close()
        except (ValueError, FileNotFoundError) as e:  # TaskSpecError is a ValueError
            # A task that cannot load or be prepared is reported, not a reason to stop the rest.
            logging.error("filter: %s: %s", source, e)
            entry = {"task": source, "error": f"{type(e).__name__}: {e}", "keep": False}
            bar.update(_N.value)
        entry["source"] = source
        entry["paper_task"] = entry["task"] in mlebench.PAPER_COMPETITIONS
        result["tasks"].append(entry)
        # Written after every task: an interrupted filter leaves the tasks it finished.
        (workdir / "filter.json").write_text(json.dumps(result, indent=1))
    bar.close()
    (workdir / "filter.md").write_text(filter_lib.markdown(result))
    filter_lib.plot(result, workdir / "filter.png")
    print(filter_lib.markdown(result))


if __name__ == "__main__":
    app.run(main)
