"""Fallback aggregate limits where no cgroup is writable (unprivileged, no delegation).

The host polls, every `poll()` (~50 ms from run_process), the resident memory of the run's
processes (the run uid's when it has one, else the descendants of the sandbox process) and
ends the whole run once their sum passes memory_mb ("oom"); every ~0.5 s it also bounds the run
dir's bytes and entries by a scan that stops at the limit ("disk"), for runs without a tmpfs.
What it cannot do: a burst between two polls can overshoot, RSS double-counts shared pages
(conservative), CPU share is only the thread-count environment, and the number of processes is
only RLIMIT_NPROC.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from rl4mle_jax.env.sandbox.local import pids_of_uid

_PAGE = os.sysconf("SC_PAGE_SIZE")
_DISK_EVERY_S = 0.5


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def dir_over(root: Path, max_bytes: int | None, max_entries: int | None,
             skip: str = "input") -> bool:
    """Does the tree under root (but root/skip, the input copy) hold more than the limits?
    Stops as soon as it knows."""
    used, n, todo = 0, 0, [str(root)]
    skip_path = os.path.join(str(root), skip)
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    if e.path == skip_path:
                        continue
                    n += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(e.path)
                    if (max_entries and n > max_entries) or (max_bytes and used > max_bytes):
                        return True
        except OSError:
            pass
    return False


class Watchdog:
    """Host-side memory (and, without tmpfs, disk) bound for one run."""

    mechanism = "watchdog"

    def __init__(self, memory_mb: int | None, uid: int | None, workdir: Path | None = None,
                 disk_mb: int | None = None, max_inodes: int | None = None):
        self.limit = int(memory_mb) << 20 if memory_mb else None
        self.uid, self.workdir = uid, workdir
        self.disk = int(disk_mb) << 20 if disk_mb else None
        self.inodes = max_inodes
        self.root_pid: int | None = None
        self.peak = 0
        self._disk_at = 0.0

    def start(self, pid: int) -> None:
        self.root_pid = pid

    def poll(self) -> str | None:
        if self.limit is None:
            pids = []
        elif self.uid is not None:
            pids = pids_of_uid(self.uid)
        elif self.root_pid is not None:
            pids = _descendants(self.root_pid)[1:]  # not the sandbox process itself
        else:
            return None
        rss = _rss_bytes(pids)
        self.peak = max(self.peak, rss)
        if self.limit is not None and rss > self.limit:
            return "oom"
        now = time.monotonic()
        if self.workdir is not None and (self.disk or self.inodes) and now > self._disk_at:
            self._disk_at = now + _DISK_EVERY_S
            if dir_over(self.workdir, self.disk, self.inodes):
                return "disk"
        return None

    def peak_memory_mb(self) -> float | None:
        return self.peak / (1 << 20) if self.peak else None
