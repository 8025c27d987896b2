"""Host-side process plumbing shared by the bwrap and subprocess backends.

- `UidPool`: a distinct unprivileged uid per concurrent run (file locks, so it holds across
  processes too). RLIMIT_NPROC counts processes per uid, so a shared uid would let one fork bomb
  starve every other slot; a private uid also lets us find and kill everything a run left behind.
- `kill_uid`: SIGKILL every process of a uid, repeated until none is left (a fork bomb forks
  while we kill).
- `run_process`: spawn, read stdout/stderr incrementally into capped buffers, enforce the
  wall-clock limit, collect the launcher's status line.
"""

from __future__ import annotations

import fcntl
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.launcher import parse_status
from rl4mle_jax.env.sandbox.result import OutputCapture

UID_BASE = int(os.environ.get("RL4MLE_SANDBOX_UID_BASE", "990000"))
UID_COUNT = 4096
_READ_CHUNK = 1 << 16


class UidPool:
    """Hands out uids in [base, base + count) that no other run (in any process) holds."""

    def __init__(self, base: int = UID_BASE, count: int = UID_COUNT, lock_dir: Path | None = None):
        self.base, self.count = base, count
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / f"rl4mle_sandbox_uids_{base}"
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def acquire(self) -> tuple[int, int]:
        """Returns (uid, lock fd); pass the fd to `release`."""
        for i in range(self.count):  # lowest free first: few lock files, reused uids
            uid = self.base + i
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            kill_uid(uid)  # a crashed earlier holder may have left processes behind
            if pids_of_uid(uid, zombies=True):
                # killed but not yet reaped by their parent: they still count against this
                # uid's RLIMIT_NPROC, so a run here could not fork. Take the next uid.
                os.close(fd)
                continue
            return uid, fd
        raise RuntimeError(f"all {self.count} sandbox uids from {self.base} are in use")

    def release(self, uid: int, fd: int) -> None:
        kill_uid(uid)
        os.close(fd)  # drops the flock


def pids_of_uid(uid: int, zombies: bool = False) -> list[int]:
    """Live processes whose real or effective uid is `uid` (read from status: /proc/PID itself
    is owned by root for processes that changed uid and are no longer dumpable); with `zombies`
    also the dead ones not yet reaped."""
    pids, want = [], str(uid)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                zombie = False
                for line in f:
                    if line.startswith(b"State:"):
                        # dead, waiting to be reaped
                        zombie = line.split()[1] in (b"Z", b"X") and not zombies
                    elif line.startswith(b"Uid:"):
                        if not zombie and want in line.decode().split()[1:3]:
                            pids.append(int(entry.name))
                        break
        except (FileNotFoundError, ProcessLookupError):
            pass
    return pids


def kill_uid(uid: int, rounds: int = 50) -> int:
    """SIGKILL all processes owned by `uid`; returns how many were signalled."""
    if uid == 0 or uid == os.getuid():
        raise ValueError(f"refusing to kill every process of uid {uid}")
    killed = 0
    for _ in range(rounds):
        pids = pids_of_uid(uid)
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.005)
    return killed


@dataclass
class RawRun:
    timed_out: bool
    outer_exit_code: int
    status: dict | None  # the launcher's line: exit_code, duration_s, maxrss_kb
    stdout: OutputCapture
    stderr: OutputCapture
    wall_s: float
    killed_at_s: float | None
    limit_hit: str | None = None  # "oom" / "disk": an aggregate limit ended the run


def run_process(argv: list[str], *, cwd: str | None, env: dict[str, str], timeout_s: float,
                output_bytes: int, status_fd: tuple[int, int], pass_fds: tuple[int, ...] = (),
                user: int | None = None, kill_tree: Callable[[], None] | None = None,
                linger_s: float = 2.0, monitor: Any = None,
                start: Callable[[int], str | None] | None = None) -> RawRun:
    """Run argv to completion or timeout, capturing output without ever holding more than the cap.

    status_fd: (read end, write end) of the launcher's status pipe; the write end is passed on.
    kill_tree: kills whatever the run may have left behind (called on timeout and after exit).
    monitor: aggregate limits (limiter.RunLimiter): `start(pid)`, then `poll()` every ~50 ms
      returning "oom"/"disk" when the run must end.
    start: called with the process's pid once it is spawned, while the status pipe's write end
      is still open (then not passed to the process): zygote.py hands the run over here. It
      returns an error text for the run's stderr, or None.
    """
    status_r, status_w = status_fd
    out, err, status_buf = OutputCapture(output_bytes), OutputCapture(output_bytes), bytearray()
    t0 = time.monotonic()
    proc = None
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env=env, pass_fds=((status_w,) if start is None else ()) + tuple(pass_fds),
            start_new_session=True, user=user, group=user,
            extra_groups=[] if user is not None else None)
    finally:
        for fd in pass_fds:  # the child's now: a pipe it never writes reads as EOF here
            os.close(fd)
        if start is None or proc is None:
            os.close(status_w)

    if monitor is not None:
        monitor.start(proc.pid)
    if start is not None:
        try:
            note = start(proc.pid)
        finally:
            os.close(status_w)
        if note is not None:
            err.feed(f"sandbox: {note}\n".encode())

    def exited() -> bool:
        # WNOWAIT: the pid stays ours (not reaped, not reusable) until proc.wait() below, so
        # killpg(proc.pid) can never hit an unrelated process group.
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped behind our back: it has certainly exited
            return True

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if kill_tree is not None:
            kill_tree()

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sel.register(status_r, selectors.EVENT_READ, None)
    deadline = t0 + timeout_s
    timed_out, killed_at, exited_at, hit = False, None, None, None
    try:
        while sel.get_map():
            now = time.monotonic()
            if not exited():
                if hit is None and not timed_out and monitor is not None:
                    hit = monitor.poll()
                    if hit is not None:
                        killed_at = now - t0
                if now >= deadline and not timed_out and hit is None:
                    timed_out, killed_at = True, now - t0
                    kill()
                elif timed_out or hit is not None:
                    kill()  # still there: keep killing (a fork bomb refills the tree)
            elif exited_at is None:
                exited_at = now
                kill()  # detached children must not outlive the program
            elif now - exited_at > linger_s:
                break  # a pipe held open by something we could not kill: give up on it
            wait = 0.05 if exited_at is not None or timed_out else max(0.0, deadline - now)
            for key, _ in sel.select(timeout=min(wait, 0.05 if monitor is not None else 0.2)):
                data = os.read(key.fd, _READ_CHUNK)
                if not data:
                    sel.unregister(key.fileobj)
                elif key.data is None:
                    status_buf += data[: max(0, 4096 - len(status_buf))]
                else:
                    key.data.feed(data)
    finally:
        sel.close()
        if not exited():
            kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        os.close(status_r)
    return RawRun(timed_out=timed_out, outer_exit_code=proc.returncode,
                  status=parse_status(bytes(status_buf)), stdout=out, stderr=err,
                  wall_s=time.monotonic() - t0, killed_at_s=killed_at, limit_hit=hit)
