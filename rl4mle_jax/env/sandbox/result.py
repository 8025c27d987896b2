"""Structured result of one sandboxed execution, output capture and status classification."""

from __future__ import annotations

import dataclasses
import re
import signal as _signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.runfs import remove_tree

STATUSES = ("ok", "error", "timeout", "killed", "oom")

# Last traceback line of a Python MemoryError (numpy raises `..._ArrayMemoryError`), or the
# messages C/C++ allocators print when RLIMIT_AS refuses them.
_OOM_RE = re.compile(
    rb"(^[\w.]*MemoryError\b|std::bad_alloc|Cannot allocate memory|[Oo]ut of memory"
    rb"|failed to allocate|Unable to allocate)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class RemoteSubmission:
    """What a remote node read at the run's submission path (env.submission's rules)."""

    present: bool  # anything at submission/submission.csv, or submission/ is a link
    read: Any  # env.submission.SubmissionRead


@dataclass
class ExecResult:
    """What happened when one program ran in a sandbox.

    status: "ok" (exit 0), "error" (nonzero exit), "timeout" (killed by our wall-clock limit),
    "killed" (died of a signal we did not send), "oom" (memory limit hit).
    exit_code: the exit status, or -signum when a signal ended the program, None on timeout.
    duration_s: wall-clock of the program itself (Δt); on timeout the time until the kill.
    wall_s: wall-clock of the whole call, sandbox set-up and tear-down included.
    cpu_s: CPU seconds (user + system) of the program and the children it waited for, from the
      launcher's wait4; None when the launcher reported no status (timeout, killed launcher).
    stdout/stderr: decoded text, head and tail kept when longer than the cap, with a marker.
    evidence: the witness's report of what the program really did (sandbox/witness.py), or None
      when no witness ran (then milestone and training checks fall back to static analysis).
    """

    status: str
    exit_code: int | None
    duration_s: float
    stdout: str
    stderr: str
    submission_path: Path
    submission_exists: bool
    workdir: Path
    backend: str
    wall_s: float = 0.0
    signal: str | None = None
    peak_memory_mb: float | None = None
    cpu_s: float | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    weak_isolation: bool = False
    warnings: list[str] = field(default_factory=list)
    evidence: dict | None = None
    # The submission as read on the machine that ran the program (remote backends: the run
    # dir is there, not here); None: read it from `workdir` (env.execute does).
    remote_submission: RemoteSubmission | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"ExecResult.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("remote_submission")  # bytes: the graded copy is kept by the caller if at all
        d["submission_path"] = str(self.submission_path)
        d["workdir"] = str(self.workdir)
        return d

    def cleanup(self) -> bool:
        """Delete the working directory (the caller reads the submission first).

        Never raises; linear in the entries whatever their depth or modes; a tmpfs run dir is
        unmounted at once. True when the directory is gone.
        """
        return remove_tree(self.workdir)


class OutputCapture:
    """Keeps the first and last `cap // 2` bytes of a stream of any length, counting the rest.

    Memory stays O(cap) however much is written, so a program printing 1 GB costs nothing.
    """

    def __init__(self, cap: int):
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data[-self.tail_cap:] if self.tail_cap else b""
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(len(self.tail), self.tail_cap)

    def raw_tail(self, n: int) -> bytes:
        """Last n bytes seen (for classification), whether they sit in head or tail."""
        joined = bytes(self.head[-n:]) + bytes(self.tail[-self.tail_cap:])
        return joined[-n:]

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_cap:]) if self.tail_cap else b""
        kept = len(self.head) + len(tail)
        if self.total <= kept:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        cut = self.total - kept
        marker = (f"\n\n[... {cut:,} bytes of output cut; first {len(self.head):,} and last "
                  f"{len(tail):,} kept ...]\n\n")
        return (bytes(self.head).decode("utf-8", errors="replace") + marker
                + tail.decode("utf-8", errors="replace"))


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def classify(*, timed_out: bool, exit_code: int | None, stderr_tail: bytes,
             peak_memory_mb: float | None, memory_mb: float | None,
             limit_hit: str | None = None) -> str:
    """Map how the program ended to one of STATUSES.

    exit_code: exit status, or -signum for a signal death; ignored when timed_out.
    limit_hit: "oom" (the tree's memory limit ended the run) or "disk" (the watchdog's disk
      bound did: "killed"); None when no aggregate limit intervened.
    """
    if limit_hit == "oom":
        return "oom"
    if limit_hit == "disk":
        return "killed"
    if timed_out:
        return "timeout"
    if exit_code == 0:
        return "ok"
    mentions_oom = bool(_OOM_RE.search(stderr_tail))
    near_limit = (peak_memory_mb is not None and memory_mb is not None
                  and peak_memory_mb >= 0.9 * memory_mb)
    if exit_code is not None and exit_code < 0:
        # SIGKILL near the limit is the kernel OOM killer; an allocator abort says so on stderr.
        if mentions_oom or (exit_code == -_signal.SIGKILL and near_limit):
            return "oom"
        return "killed"
    return "oom" if mentions_oom else "error"
