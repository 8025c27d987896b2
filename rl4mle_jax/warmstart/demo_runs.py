"""Demonstration runs: each generated program run and graded as an RL episode would be.

Every record carries the program's real Δt, status, score, reward and the one-line outcome an
improve prompt shows; invalid runs are kept (the SFT filter chooses). The sandbox run is the
environment's one run-and-grade step (`env.execute.run_and_grade`). No jax here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.prompts import format_outcome
from rl4mle_jax.warmstart.demos import DemoProgram, generate_programs


@dataclasses.dataclass
class Demo:
    """A demonstration program with the outcome of its real sandbox run on the reward split."""

    task_id: str
    plan: str
    code: str
    family: str
    params: dict
    duration_s: float | None
    status: str  # sandbox status: ok, error, timeout, killed, oom
    score: float | None
    valid: bool
    reason: str | None = None  # failure reason (reward record) and the error, if any
    reward: float | None = None  # the paper's reward, as the RL loop computes it
    milestones: list = dataclasses.field(default_factory=list)
    outcome: str = ""  # the one-line outcome an improve prompt shows (prompts.format_outcome)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def response(self) -> str:
        return render_response(self.plan, self.code)


def render_response(plan: str, code: str) -> str:
    """The answer an agent gives: the plan, then one fenced Python block."""
    return f"{plan}\n\n```python\n{code.rstrip()}\n```"


# ----------------------------------------------------------------------------- running


def default_sandbox(timeout_s: float = 300.0):
    """The bwrap sandbox when it works here, else the (weaker) subprocess backend."""
    from rl4mle_jax.env.execute import default_sandbox as make

    return make(timeout_s, cpus=1)


def run_demo(task, program: DemoProgram, sandbox, split: str = "reward",
             timeout_s: float | None = None) -> Demo:
    """Runs one program as an RL episode would (static instrumentation, fresh nonce, sandbox,
    grader, the paper's reward) and records the outcome."""
    rec = run_and_grade(program.code, task, sandbox, split=split,
                        timeout_s=timeout_s or task.timeout_s).reward
    reason = rec.failure_reason
    if rec.error:
        reason = f"{reason}: {rec.error.get('type')}: {rec.error.get('message')}"[:300]
    return Demo(task.id, program.plan, program.code, program.family, dict(program.params),
                rec.duration_s, rec.exec_status or "not_run", rec.score, rec.status == "valid",
                reason, rec.reward, list(rec.milestones), format_outcome(rec))


def run_demos(task, programs: Sequence[DemoProgram], sandbox=None, split: str = "reward",
              workers: int = 2, timeout_s: float | None = None) -> list[Demo]:
    """Runs `programs` concurrently (`workers` sandbox slots); results in program order."""
    sandbox = sandbox or default_sandbox()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda p: run_demo(task, p, sandbox, split, timeout_s), programs))


def make_demos(task, n: int = 16, seed: int = 0, sandbox=None, workers: int = 2,
               timeout_s: float | None = None, edits: int = 0) -> list[Demo]:
    """Generate `n` programs for `task` (and up to `edits` edited copies,
    `demos.generate_programs`) and run each on its reward split."""
    return run_demos(task, generate_programs(task, n=n, seed=seed, edits=edits), sandbox,
                     workers=workers, timeout_s=timeout_s)


def save_demos(path: str | os.PathLike, demos: Sequence[Demo]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(d.to_json()) + "\n" for d in demos), encoding="utf-8")
    os.replace(tmp, path)


def load_demos(path: str | os.PathLike) -> list[Demo]:
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            out.append(Demo(**json.loads(line)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}:{lineno}: not a demo record ({e})") from None
    return out
