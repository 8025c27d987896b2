"""Baseline solution programs for the local tasks, run like an agent's (sandbox, grader).

Each ``<task_id with _>_<kind>.py`` is a script an agent could have written: it reads
``./input/*.csv`` and writes ``./submission/submission.csv``. "baseline" is simple; "strong"
(where cheap) is a better model. The scripts are data, never imported.
"""

from __future__ import annotations

from pathlib import Path

BASELINE_DIR = Path(__file__).resolve().parent
KINDS = ("baseline", "strong")


def baseline_path(task_id: str, kind: str = "baseline") -> Path:
    return BASELINE_DIR / f"{task_id.replace('-', '_')}_{kind}.py"


def available(task_id: str) -> list[str]:
    """Kinds of hand-written baseline that exist for `task_id`."""
    return [k for k in KINDS if baseline_path(task_id, k).exists()]


def reference_code(task, kind: str = "baseline") -> str:
    """The `kind` solution of `task`: the hand-written script of a local task, else the one the
    warm start's demonstration generator writes for the task's data (any task directory)."""
    path = baseline_path(task.id, kind)
    if path.exists():
        return path.read_text()
    from rl4mle_jax.warmstart.demos import reference_program

    return reference_program(task, kind).code


def run_baseline(task, kind: str = "baseline", split: str = "reward",
                 timeout_s: float | None = None, sandbox=None):
    """Run one baseline on `split` through the one run-and-grade step (`env.execute`).

    Returns the RunRecord; its `grade` holds the reference score (the grader's, whether or not
    the reward rules would call the program trained).
    """
    from rl4mle_jax.env.execute import default_sandbox, run_and_grade

    code = reference_code(task, kind)
    sandbox = sandbox or default_sandbox(timeout_s or task.timeout_s)
    return run_and_grade(code, task, sandbox, split=split, timeout_s=timeout_s or task.timeout_s)


def measure_reference(task, kinds: list[str] | None = None, sandbox=None) -> dict:
    """Reference scores of `task` from its baselines on both splits (raises if one fails)."""
    from rl4mle_jax.env.execute import default_sandbox

    sandbox = sandbox or default_sandbox(task.timeout_s)
    scores: dict = {"reward": {}, "test": {}}
    runtime: dict = {"reward": {}, "test": {}}
    for kind in kinds or available(task.id) or list(KINDS):
        for split in ("reward", "test"):
            run = run_baseline(task, kind, split, sandbox=sandbox)
            rep = run.grade
            if rep is None or not rep.valid:
                stderr = (run.exec or {}).get("stderr", "")[-2000:]
                why = f"{rep.reason}: {rep.message}" if rep is not None else \
                    run.reward.failure_reason
                raise RuntimeError(f"{task.id} {kind} on {split}: {why}\n{stderr}")
            scores[split][kind] = round(rep.score, 6)
            runtime[split][kind] = round(run.duration_s, 2)
    return dict(scores=scores, runtime_s=runtime)
