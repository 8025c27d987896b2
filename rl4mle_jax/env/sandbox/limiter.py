"""One run's aggregate limits, whichever mechanism this machine allows (cgroups.py, watchdog.py).

    lim = RunLimiter(cgroups, limits, uid=uid, workdir=wd)
    raw = run_process(lim.argv_prefix() + argv, ..., monitor=lim, kill_tree=lim.kill)
    lim.close()  # after reading lim.peak_memory_mb() / lim.final_hit()
"""

from __future__ import annotations

import logging
from pathlib import Path

from rl4mle_jax.env.sandbox.cgroups import Cgroups, RunCgroup
from rl4mle_jax.env.sandbox.local import kill_uid
from rl4mle_jax.env.sandbox.runfs import is_run_fs
from rl4mle_jax.env.sandbox.watchdog import Watchdog

log = logging.getLogger(__name__)


class RunLimiter:
    """A run cgroup when `cgroups` is given (and works), else the host-side watchdog."""

    def __init__(self, cgroups: Cgroups | None, limits, *, uid: int | None, workdir: Path):
        self.uid = uid
        self.run_fs = is_run_fs(workdir)
        self.cg: RunCgroup | None = None
        self.notes: list[str] = []
        if cgroups is not None:
            try:
                self.cg = cgroups.create(limits.memory_mb, limits.cpus, limits.max_procs,
                                         limits.nice)
            except OSError as e:
                self.notes.append(f"{cgroups.mechanism} not created ({e}); watchdog instead")
        self.dog = None if self.cg is not None and self.run_fs else Watchdog(
            limits.memory_mb if self.cg is None else None, uid,
            workdir if not self.run_fs else None, limits.disk_mb, limits.max_inodes)
        self.mechanism = self.cg.mechanism if self.cg is not None else "watchdog"
        disk = "tmpfs" if self.run_fs else "watchdog scan" if self.dog else "none"
        self.notes.insert(0, f"aggregate limits: {self.mechanism}; run dir bound: {disk}")

    def argv_prefix(self) -> list[str]:
        return self.cg.argv_prefix() if self.cg is not None else []

    def start(self, pid: int) -> None:
        if self.dog is not None:
            self.dog.start(pid)

    def poll(self) -> str | None:
        hit = self.cg.poll() if self.cg is not None else None
        return hit or (self.dog.poll() if self.dog is not None else None)

    def final_hit(self) -> str | None:
        """After the run: did the kernel OOM-kill anything (the watchdog's hits are in RawRun)?"""
        return self.cg.poll() if self.cg is not None else None

    def kill(self) -> None:
        if self.cg is not None:
            self.cg.kill()
        if self.uid is not None:
            kill_uid(self.uid)

    def peak_memory_mb(self) -> float | None:
        if self.cg is not None:
            return self.cg.peak_memory_mb()
        return self.dog.peak_memory_mb() if self.dog is not None else None

    def close(self) -> None:
        if self.cg is not None:
            self.cg.remove()
