"""Baseline solution programs for the local tasks, run like an agent's (sandbox, grader).

Each ``<task_id with _>_<kind>.py`` is a script an agent could have written: it reads
``./input/*.csv`` and writes ``./submission/submission.csv``. "baseline" is simple; "strong"
(where cheap) is a better model. The scripts are data, never imported.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

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
            score, why = _graded_score(run)
            if score is None:
                stderr = (run.exec or {}).get("stderr", "")[-2000:]
                raise RuntimeError(f"{task.id} {kind} on {split}: {why}\n{stderr}")
            scores[split][kind] = score
            runtime[split][kind] = round(run.duration_s, 2)
    return dict(scores=scores, runtime_s=runtime)


def _graded_score(run) -> tuple[float | None, str]:
    """A baseline run's reference score (rounded to 6 places) and "", or None and why it has
    none (the grader's reason, or the run's failure)."""
    rep = run.grade
    if rep is not None and rep.valid:
        return round(float(rep.score), 6), ""
    return None, (f"{rep.reason}: {rep.message}" if rep is not None
                  else run.reward.failure_reason)


def ensure_reference_scores(task, sandbox, cache_dir: str | os.PathLike,
                            log: Callable[[str], None] = lambda s: None,
                            baseline_key: str = "baseline") -> bool:
    """Give a task that has no reward-split `baseline_key` score (`reward.baseline_key`; a task
    directory never calibrated) the scores of its baseline and strong solutions on both splits,
    measured once and cached.

    The reward's "auto" and "rescaled" normalisations place a valid score against these
    references (an RMSE of 23 in a price's units, left flipped, is paid no more than a failure),
    and report.md places the pick against them. The scores go into `task.reference_scores` in
    memory only, under any the task already has; `python -m rl4mle_jax.env calibrate DIR
    --write` records them in its task.json. The cache key covers the task's content, its test
    answers and the two programs' code, so a changed task or generator measures afresh. A
    solution that fails is logged and left out; the cache keeps that outcome too (each run
    would otherwise pay the failure again), so delete the file the log names to measure anew.
    Returns whether the task now has a reward-split `baseline_key` score."""
    def has_baseline() -> bool:
        return (task.reference_scores or {}).get("reward", {}).get(baseline_key) is not None

    if has_baseline():
        return True
    try:
        codes = {kind: reference_code(task, kind) for kind in KINDS}
    except Exception as e:  # noqa: BLE001 - data the generator cannot profile: run without
        log(f"task {task.id}: no reference solutions could be generated for its data "
            f"({type(e).__name__}: {e})")
        return False

    def measure() -> dict:
        measured: dict = {"reward": {}, "test": {}}
        for kind in KINDS:
            for split in ("reward", "test"):
                score, why = _graded_score(run_baseline(task, kind, split, sandbox=sandbox))
                if score is not None and math.isfinite(score):
                    measured[split][kind] = score
                else:
                    why = why or f"non-finite score {score}"
                    log(f"task {task.id}: its generated {kind} solution failed on the {split} "
                        f"split ({why}); no {kind} reference score there")
        return measured

    measured, how = _cached_json(
        Path(cache_dir) / f"{task.id}-{_cache_key(task, codes)}.json", measure)
    given = task.reference_scores or {}
    task.reference_scores = {split: {**measured.get(split, {}), **given.get(split, {})}
                             for split in sorted({*measured, *given})}
    log(f"task {task.id} has no reference scores in its task.json: those of its generated "
        f"baseline and strong solutions ({how}) are used: {task.reference_scores}; `python -m "
        f"rl4mle_jax.env calibrate {task.root} --write` records them")
    return has_baseline()


def _cache_key(task, codes) -> str:
    """What a measured reference depends on: the task's content, its test answers, the
    generated programs and the time limit."""
    from rl4mle_jax.env.datasets.splits import sha256_file_cached

    return hashlib.sha256(json.dumps(
        [task.fingerprint()["digest"], sha256_file_cached(task.answers_path("test")), codes,
         task.timeout_s]).encode()).hexdigest()[:16]


def _cached_json(path: Path, measure: Callable[[], Any]) -> tuple[Any, str]:
    """(the JSON cached at `path`, or `measure()` written there atomically; how it was had)."""
    try:
        return json.loads(path.read_text()), f"cached in {path}"
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    t0 = time.monotonic()
    value = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
    return value, f"measured in {time.monotonic() - t0:.0f} s, cached in {path}"


def ensure_reference_se(task, sandbox, cache_dir: str | os.PathLike,
                        log: Callable[[str], None] = lambda s: None) -> float | None:
    """The standard error of a typical valid score on the reward split: the spread of the
    generated baseline solution's score over the grader's paired resamples of the split's rows
    (`GradeReport.score_boot`), measured once per task and cached; set as
    `task.reference_se["reward"]`, where the grader passes it to every grade report.

    The "rescaled" reward divides by the baseline-to-strong gap; on a small split that gap can
    be far below what the split resolves (titanic-survival: 0.0096 AUC against a standard
    error of 0.03), and every noise-level difference between two programs would then be paid
    whole reward units. `env.reward.rescale_unit` keeps the unit at least
    `reward.rescale_min_se` of these standard errors. Returns the SE, or None where the
    baseline did not score or the grader kept no resamples (splits over its size or time
    limits: their SE is small anyway)."""
    if (task.reference_se or {}).get("reward") is not None:
        return task.reference_se["reward"]
    try:
        code = reference_code(task, "baseline")
    except Exception as e:  # noqa: BLE001 - data the generator cannot profile: no floor
        log(f"task {task.id}: no baseline solution could be generated for its data "
            f"({type(e).__name__}: {e}); its rescaled reward has no noise floor")
        return None

    def measure() -> dict:
        run = run_baseline(task, "baseline", "reward", sandbox=sandbox)
        boot = getattr(run.grade, "score_boot", None) if run.grade is not None else None
        finite = [float(b) for b in boot or () if b is not None and math.isfinite(b)]
        return {"reward": float(np.std(finite, ddof=1)) if len(finite) >= 2 else None}

    cached, how = _cached_json(
        Path(cache_dir) / f"{task.id}-{_cache_key(task, {'baseline': code})}-se.json", measure)
    se = cached.get("reward") if isinstance(cached, dict) else None
    if se is None:
        log(f"task {task.id}: its baseline solution gave no resampled scores on the reward "
            f"split ({how}); its rescaled reward has no noise floor")
        return None
    task.reference_se = {**(task.reference_se or {}), "reward": se}
    log(f"task {task.id}: standard error of a score on the reward split {se:.4g} (its "
        f"baseline's, over the grader's resamples; {how})")
    return se
