"""Local task suite: real datasets that ship inside installed packages (no downloads).

``REGISTRY`` maps task id -> definition; ``build_task`` prepares one into a data root.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl4mle_jax.env.datasets.common import (
    LocalTask,
    data_digest,
    finish_checksums,
    is_current,
    write_local_task,
)
from rl4mle_jax.env.suite import LOCATIONS, get

REGISTRY: dict[str, LocalTask] = {tid: get(tid) for tid in LOCATIONS}
# Every definition is where the registry says (the registry is what tasks.py reads).
assert all(d.id == tid for tid, d in REGISTRY.items()), "env/suite.py is out of date"


def _reference_scores(task, digest: str, reference: str) -> dict:
    from rl4mle_jax.env.datasets.reference_scores import RECORDED

    rec = RECORDED.get(task.id)
    if reference != "compute" and rec is not None and rec.get("data_sha256") == digest:
        return {s: dict(rec[s]) for s in ("reward", "test") if s in rec}
    if reference == "recorded":
        return {}
    from rl4mle_jax.env.baselines import measure_reference

    return measure_reference(task)["scores"]


def build_task(task_id: str, data_root: Path, *, force: bool = False, reference: str = "auto"):
    """Prepare `task_id` under `data_root/<id>`; a no-op (checksums verified) when current."""
    from rl4mle_jax.env.tasks import TaskSpecError, load_task_dir

    if task_id not in REGISTRY:
        raise TaskSpecError(f"unknown local task {task_id!r}; known: {sorted(REGISTRY)}")
    if reference not in ("auto", "recorded", "compute"):
        raise ValueError(f"reference must be auto|recorded|compute, got {reference!r}")
    root = Path(data_root) / task_id
    if not force and is_current(root) and reference != "compute":
        return load_task_dir(root, data_root=data_root)
    spec = write_local_task(REGISTRY[task_id], root)
    task = load_task_dir(root, data_root=data_root)
    task.ensure_reward_split()
    digest = data_digest(finish_checksums(root))
    spec["data_sha256"] = digest
    spec["reference_scores"] = _reference_scores(task, digest, reference)
    (root / "task.json").write_text(json.dumps(spec, indent=1))
    return load_task_dir(root, data_root=data_root)
