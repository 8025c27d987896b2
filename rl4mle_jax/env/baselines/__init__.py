"""Baseline solution programs for the local tasks, and a plain-subprocess runner for them.

Each ``<task_id with _>_<kind>.py`` is a script an agent could have written: it reads
``./input/*.csv`` and writes ``./submission/submission.csv``. "baseline" is simple; "strong"
(where cheap) is a better model. The scripts are data, never imported.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE_DIR = Path(__file__).resolve().parent
KINDS = ("baseline", "strong")


def baseline_path(task_id: str, kind: str = "baseline") -> Path:
    return BASELINE_DIR / f"{task_id.replace('-', '_')}_{kind}.py"


def available(task_id: str) -> list[str]:
    """Kinds of baseline that exist for `task_id`."""
    return [k for k in KINDS if baseline_path(task_id, k).exists()]


def run_program_subprocess(code: str, input_dir: Path, timeout_s: float = 300.0,
                           workdir: Path | None = None) -> dict:
    """Run `code` in a fresh workdir (./input -> input_dir, ./submission/) with one thread.

    Not a sandbox (no isolation): for trusted baseline programs only.
    """
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="rl4mle-run-")) if own else Path(workdir)
    (wd / "submission").mkdir(parents=True, exist_ok=True)
    if not (wd / "input").exists():
        (wd / "input").symlink_to(Path(input_dir).resolve(), target_is_directory=True)
    (wd / "main.py").write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    t0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run([sys.executable, "main.py"], cwd=wd, env=env, capture_output=True,
                              text=True, timeout=timeout_s)
        status, rc, out, err = ("ok" if proc.returncode == 0 else "error"), proc.returncode, \
            proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        status, rc, out, err = "timeout", None, str(e.stdout or ""), str(e.stderr or "")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    sub = wd / "submission" / "submission.csv"
    return dict(status=status, exit_code=rc, duration_s=time.monotonic() - t0,
                cpu_s=cpu,  # children's CPU time: meaningful when runs are not concurrent
                stdout=out[-4000:],
                stderr=err[-4000:], submission_path=str(sub), submission_exists=sub.exists(),
                workdir=str(wd))


def run_baseline(task, kind: str = "baseline", split: str = "reward",
                 timeout_s: float | None = None) -> dict:
    """Run one baseline on `split` and grade it: {"report": GradeReport, "run": {...}}."""
    from rl4mle_jax.env.grading import grade

    code = baseline_path(task.id, kind).read_text()
    with tempfile.TemporaryDirectory(prefix="rl4mle-baseline-") as wd:
        run = run_program_subprocess(code, task.input_dir(split), timeout_s or task.timeout_s,
                                     workdir=Path(wd))
        report = grade(task, run["submission_path"], split=split)
    return dict(report=report, run=run)


def measure_reference(task, kinds: list[str] | None = None) -> dict:
    """Reference scores of `task` from its baselines on both splits (raises if one fails)."""
    scores: dict = {"reward": {}, "test": {}}
    runtime: dict = {"reward": {}, "test": {}}
    for kind in kinds or available(task.id):
        for split in ("reward", "test"):
            res = run_baseline(task, kind, split)
            rep = res["report"]
            if not rep.valid:
                raise RuntimeError(f"{task.id} {kind} on {split}: {rep.reason}: {rep.message}\n"
                                   f"{res['run']['stderr'][-2000:]}")
            scores[split][kind] = round(rep.score, 6)
            runtime[split][kind] = round(res["run"]["duration_s"], 2)
    return dict(scores=scores, runtime_s=runtime)
