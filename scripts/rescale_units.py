"""The "rescaled" reward's unit per task: the references' gap on the reward split against what
the split resolves (env.reward.RESCALE_MIN_SE standard errors of a score there).

Measures (or reads from the caches a run uses) each task's reference scores and the standard
error of its baseline's score over the grader's resamples, then prints per task: metric,
baseline, strong, their gap, the standard error, the unit the reward uses, whether the floor
set it, and the reward a program one standard error worse than the baseline is paid (before
the floor and with it). Where the floor sets the unit, the gap alone would have paid a
noise-level difference that much.

  python scripts/rescale_units.py                       # every suite task
  python scripts/rescale_units.py hotel-rates /work/tasks/titanic-survival

A few seconds per task (one run of its baseline on the reward split, more for slow tasks;
cached after).
"""

import logging
import sys
from pathlib import Path

from absl import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rl4mle_jax.env.baselines import ensure_reference_scores, ensure_reference_se  # noqa: E402
from rl4mle_jax.env.execute import default_sandbox  # noqa: E402
from rl4mle_jax.env.metrics import oriented_score  # noqa: E402
from rl4mle_jax.env.reward import RewardConfig, normalise_score, rescale_unit  # noqa: E402
from rl4mle_jax.env.suite import local_task_ids  # noqa: E402
from rl4mle_jax.env.tasks import default_data_root, load_task  # noqa: E402


def row(name: str, cfg: RewardConfig, cache: Path) -> str:
    task = load_task(name)
    box = default_sandbox(task.timeout_s)
    if not ensure_reference_scores(task, box, cache, logging.info):
        return f"| {task.id} | {task.metric} | no reward-split baseline | | | | | | |"
    refs = task.reference_scores["reward"]
    se = ensure_reference_se(task, box, cache, logging.info)
    gap, unit = rescale_unit(refs, cfg), rescale_unit(refs, cfg, se)
    base, strong = refs[cfg.baseline_key], refs.get(cfg.strong_key, float("nan"))
    if se is None:
        return (f"| {task.id} | {task.metric} | {base:.4g} | {strong:.4g} | {gap:.4g} | — | "
                f"{unit:.4g} | no | |")
    worse = base - oriented_score(se, task.direction)  # one standard error worse
    before = normalise_score(worse, task.direction, refs, cfg)[0]
    after = normalise_score(worse, task.direction, refs, cfg, se)[0]
    return (f"| {task.id} | {task.metric} | {base:.4g} | {strong:.4g} | {gap:.4g} | {se:.4g} | "
            f"{unit:.4g} | {'yes' if unit > gap else 'no'} | "
            f"{before:+.2f} → {after:+.2f} |")


def main(argv: list[str]) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    names = argv[1:] or local_task_ids()
    cfg = RewardConfig(normalisation="rescaled")
    cache = default_data_root() / "_references"
    print("| task | metric | baseline | strong | gap | SE of a score | unit | floor sets it "
          "| reward 1 SE below the baseline (gap alone → with the floor) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        print(row(name, cfg, cache), flush=True)


if __name__ == "__main__":
    app.run(main)
