"""The one run-and-grade step: instrument → execute in the sandbox → grade → reward.

Every path that executes an agent's program goes through `run_and_grade` (or its awaitable twin
`arun_and_grade`): the loop's episodes, best-of-N evaluation, the CLI `run`, the report's best
solution, the warm start's demonstrations and the reference baselines. It returns one
`RunRecord` (instrumented program, nonce, execution result, grade, reward record), so the reward
rules hold everywhere and a fork that changes them changes `reward.compute_reward` only.

Every host step here is total: whatever the program wrote, printed or left behind, the result
is a record with a named reason, never an exception (an episode is scored, never dropped). The
submission is read by `grading.grade_run_bytes`, which never follows a link and bounds bytes, rows,
columns and cells before parsing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl4mle_jax.env.actions import Action, extract_action
from rl4mle_jax.env.grading import GradeReport, grade_read, grade_run_bytes
from rl4mle_jax.env.instrument import (
    InstrumentedProgram,
    instrument_static,
    new_nonce,
    new_placeholder,
)
from rl4mle_jax.env.instrument_lm import NoGenerateError
from rl4mle_jax.env.reward import RewardConfig, RewardRecord, compute_reward
from rl4mle_jax.env.submission import submission_present
from rl4mle_jax.env.tasks import TaskSpecError

log = logging.getLogger(__name__)

DEFAULT_REWARD = RewardConfig()


@dataclass
class RunRecord:
    """One program, run once on one split and graded."""

    split: str
    reward: RewardRecord
    program: InstrumentedProgram | None = None
    nonce: str | None = None
    exec: dict | None = None  # ExecResult.to_dict(): status, Δt, output, evidence, ...
    grade: GradeReport | None = None
    timings: dict[str, float] = field(default_factory=dict)  # instrument_s, sandbox_wall_s, grade_s
    submission: bytes | None = None  # the graded bytes, kept only when asked for

    @property
    def valid(self) -> bool:
        return self.reward.status == "valid"

    @property
    def score(self) -> float | None:
        """The grader's raw score when the reward rules call the run valid, else None."""
        return self.reward.score if self.valid else None

    @property
    def duration_s(self) -> float:
        return float(self.reward.duration_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the submission bytes are left out."""
        p = self.program
        return {"split": self.split, "reward": self.reward.to_dict(),
                "grade": self.grade.to_dict() if self.grade is not None else None,
                "exec": self.exec, "nonce": self.nonce, "timings": dict(self.timings),
                "instrumentation": None if p is None else {
                    "method": p.method, "milestones_placed": list(p.milestones),
                    "static_training": p.static_training, **p.verification}}


# ---------------------------------------------------------------- the steps
def instrument(code: str, instrumenter: Any = None) -> InstrumentedProgram:
    """The program with milestone markers; total (any failure keeps the code unmarked)."""
    try:
        return instrumenter(code) if instrumenter is not None else instrument_static(code)
    except NoGenerateError:
        raise  # the set-up is wrong, not the program: stop loudly
    except Exception as e:  # noqa: BLE001 - instrumentation never decides an episode's fate
        log.warning("instrumentation failed (%s); running the program without markers",
                    type(e).__name__)
        return InstrumentedProgram(code, code, new_placeholder(code), (), "none",
                                   verification={"reason": f"instrument_error:{type(e).__name__}"})


def _host_failure(reason: str, nonce: str | None, res: Any, cfg: RewardConfig,
                  timeout_s: float | None) -> RewardRecord:
    rec = RewardRecord(cfg.failure_reward, "failure", reason, normalisation=cfg.normalisation,
                       nonce=nonce, timeout_s=timeout_s)
    if res is not None:
        rec.exec_status, rec.exit_code = res.status, res.exit_code
        rec.duration_s = float(res.duration_s or 0.0)
    return rec


def _grade(res: Any, task: Any, split: str, keep: bool) -> tuple[GradeReport | None,
                                                              bytes | None, bool]:
    """(grade report, submission bytes if kept, whether anything sits at the submission path)."""
    remote = getattr(res, "remote_submission", None)
    if remote is not None:  # read on the node that ran it, under the same rules
        if not remote.present:
            return None, None, False
        report, data = grade_read(task, remote.read, split)
        return report, (data if keep else None), True
    wd = Path(res.workdir)
    if not submission_present(wd):
        return None, None, False
    report, data = grade_run_bytes(task, wd, split)
    return report, (data if keep else None), True


def _score(res: Any, program: InstrumentedProgram, nonce: str, task: Any, split: str,
           cfg: RewardConfig, timeout_s: float | None, action: Action | None,
           keep_submission: bool, timings: dict[str, float]) -> RunRecord:
    """Grade the run dir, compute the reward, delete the run dir; total."""
    t = time.perf_counter()
    report, data = None, None
    try:
        report, data, present = _grade(res, task, split, keep_submission)
        if present and not res.submission_exists:  # a link or odd file: graded as invalid
            res = dataclasses.replace(res, submission_exists=True)
        rec = compute_reward(action, program, res, report, nonce, cfg, timeout_s)
    except TaskSpecError:
        raise  # the task is broken, not the program: stop loudly
    except Exception as e:  # noqa: BLE001 - a host step failing is the episode's -10, named
        log.exception("grading or reward failed for a %s run", split)
        rec = _host_failure(f"host_error:{type(e).__name__}", nonce, res, cfg, timeout_s)
    finally:
        try:
            res.cleanup()
        except Exception:  # noqa: BLE001 - cleanup must never lose the record
            log.exception("sandbox cleanup failed for %s", getattr(res, "workdir", "?"))
    timings["grade_s"] = time.perf_counter() - t
    return RunRecord(split=split, reward=rec, program=program, nonce=nonce,
                     exec=res.to_dict() if hasattr(res, "to_dict") else None, grade=report,
                     timings=timings, submission=data)


def run_and_grade(code: str, task: Any, sandbox: Any, *, split: str = "reward",
                  instrumenter: Any = None, program: InstrumentedProgram | None = None,
                  cfg: RewardConfig = DEFAULT_REWARD, timeout_s: float | None = None,
                  action: Action | None = None, keep_submission: bool = False) -> RunRecord:
    """Instrument `code` (or take `program`), run it with a fresh nonce, grade, reward.

    instrumenter: code -> InstrumentedProgram (default: static markers). timeout_s: the
    program's wall-clock limit (default: the task's).
    """
    timings: dict[str, float] = {}
    t = time.perf_counter()
    program = program if program is not None else instrument(code, instrumenter)
    timings["instrument_s"] = time.perf_counter() - t
    nonce = new_nonce()
    timeout = timeout_s if timeout_s is not None else getattr(task, "timeout_s", None)
    t = time.perf_counter()
    res = sandbox.run(program.render(nonce), task.input_dir(split), timeout_s=timeout)
    timings["sandbox_wall_s"] = time.perf_counter() - t  # host wall-clock of the call
    return _score(res, program, nonce, task, split, cfg, timeout, action, keep_submission,
                  timings)


async def arun_and_grade(code: str, task: Any, sandbox: Any, *, split: str = "reward",
                         instrumenter: Any = None, program: InstrumentedProgram | None = None,
                         cfg: RewardConfig = DEFAULT_REWARD, timeout_s: float | None = None,
                         action: Action | None = None, keep_submission: bool = False
                         ) -> RunRecord:
    """`run_and_grade` for asyncio: the sandbox on its thread pool, grading off the loop."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    if program is None:
        program = await asyncio.to_thread(instrument, code, instrumenter)
    timings["instrument_s"] = time.perf_counter() - t
    nonce = new_nonce()
    timeout = timeout_s if timeout_s is not None else getattr(task, "timeout_s", None)
    t = time.perf_counter()
    res = await sandbox.arun(program.render(nonce), task.input_dir(split), timeout_s=timeout)
    timings["sandbox_wall_s"] = time.perf_counter() - t  # host wall-clock of the call
    return await asyncio.to_thread(_score, res, program, nonce, task, split, cfg, timeout,
                                   action, keep_submission, timings)


def no_run_record(action: Action, split: str, cfg: RewardConfig = DEFAULT_REWARD) -> RunRecord:
    """The record of a response with nothing runnable (no code block, syntax error, ...)."""
    return RunRecord(split=split, reward=compute_reward(action, None, None, None, None, cfg))


def run_response(response: str, task: Any, sandbox: Any, **kw: Any) -> tuple[Action, RunRecord]:
    """`run_and_grade` on the code of a model response; unrunnable answers short-circuit."""
    action = extract_action(response)
    if not action.ok:
        return action, no_run_record(action, kw.get("split", "reward"),
                                     kw.get("cfg", DEFAULT_REWARD))
    return action, run_and_grade(action.code, task, sandbox, action=action, **kw)


def default_sandbox(timeout_s: float = 300.0, cpus: float = 1.0, preimport: str = "") -> Any:
    """The bwrap sandbox when it works here, else the (weaker, and saying so) subprocess one.
    preimport: the bwrap sandbox's (`Sandbox`; programs forked from a pre-imported
    interpreter, as root)."""
    from rl4mle_jax.env.sandbox import Sandbox

    box = None
    try:
        box = Sandbox(backend="bwrap", timeout_s=timeout_s, cpus=cpus, preimport=preimport)
        with tempfile.TemporaryDirectory() as empty:
            os.chmod(empty, 0o755)  # the sandbox runs as an unprivileged uid
            probe = box.run("print('ok')", input_dir=empty, timeout_s=30)
            probe.cleanup()
        if probe.status == "ok":
            return box
    except Exception:  # noqa: BLE001 - any bwrap failure means: use the fallback
        pass
    if box is not None:
        box.close()
    return Sandbox(backend="subprocess", timeout_s=timeout_s, cpus=cpus)
