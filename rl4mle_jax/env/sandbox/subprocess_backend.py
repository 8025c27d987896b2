"""Plain-subprocess backend for machines without bubblewrap: resource limits, no namespaces.

It keeps the contract (fresh workdir, ./input, ./submission, limits, timeout, capped output) but
its isolation is weaker and every result says so (`weak_isolation`, `warnings`):
- no network isolation;
- no filesystem isolation: the program reads whatever its uid may read, and world-writable
  places such as /tmp stay writable;
- aggregate limits and the run dir's tmpfs as in bwrap (cgroups.py, runfs.py); as root the
  input is a symlink to the root-owned staged copy (staging.py), otherwise a private copy;
- as root it runs as a per-run unprivileged uid (so RLIMIT_NPROC holds and everything it leaves
  behind is found and killed by uid) only if that uid can execute the interpreter; otherwise it
  runs as the caller, where RLIMIT_NPROC is not enforced (root) or counts all of the caller's
  processes, and children that leave the process group (setsid) may survive the timeout.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from rl4mle_jax.env.sandbox.cgroups import detect
from rl4mle_jax.env.sandbox.common import (
    PROGRAM_NAME,
    Limits,
    finish,
    input_warnings,
    prepare_workdir,
    sandbox_env,
    sweep_leftovers,
)
from rl4mle_jax.env.sandbox.launcher import launcher_argv
from rl4mle_jax.env.sandbox.limiter import RunLimiter
from rl4mle_jax.env.sandbox.local import UidPool, run_process
from rl4mle_jax.env.sandbox.result import ExecResult
from rl4mle_jax.env.sandbox.runfs import walk
from rl4mle_jax.env.sandbox.staging import stage_input

log = logging.getLogger(__name__)

BASE_WARNINGS = (
    "subprocess backend: weaker isolation than bwrap",
    "no network isolation: the program can open sockets and resolve names",
    "no filesystem isolation: reads are limited only by file permissions",
    "world-writable places outside the workdir (/tmp, /dev/shm) stay writable",
)


@functools.lru_cache(maxsize=16)
def _runs_as_other_uid(python: str, uid: int) -> bool:
    """Can an unprivileged uid start this interpreter (pyenv under /root, mode 700, cannot)?"""
    try:
        r = subprocess.run([python, "-I", "-c", "import os, json"], user=uid, group=uid,
                           extra_groups=[], capture_output=True, timeout=60, cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _check_traversable(path: Path) -> None:
    """The unprivileged uid must reach its run dir through every ancestor of work_root."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if d.exists() and not os.stat(d).st_mode & 0o001:
            raise ValueError(f"sandbox work_root {path}: {d} is not traversable by other users "
                             "(mode lacks o+x), so the unprivileged uid cannot reach its workdir")


class SubprocessBackend:
    """Runs programs as ordinary child processes with rlimits (see the module docstring)."""

    name = "subprocess"

    def __init__(self, python: str, work_root: Path):
        self.python = python
        self.work_root = work_root
        self.pool: UidPool | None = None
        self.warnings = list(BASE_WARNINGS)
        self.cgroups, self.cgroup_notes = detect()
        self.mechanism = self.cgroups.mechanism if self.cgroups is not None else "watchdog"
        sweep_leftovers(work_root)
        if os.geteuid() == 0:
            pool = UidPool()
            uid, fd = pool.acquire()
            try:
                usable = _runs_as_other_uid(python, uid)
            finally:
                pool.release(uid, fd)
            if usable:
                self.pool = pool
                _check_traversable(work_root)
            else:
                self.warnings.append(
                    f"running as root: an unprivileged uid cannot execute {python}, so "
                    "RLIMIT_NPROC is not enforced (fork bombs are not contained) and detached "
                    "children may survive; pass python= an interpreter outside /root")
        else:
            self.warnings.append(
                f"running as the calling user (uid {os.getuid()}): RLIMIT_NPROC counts all of "
                "that user's processes and detached children (setsid) may survive the timeout")
        log.warning("SANDBOX ISOLATION IS WEAK: %s", "; ".join(self.warnings))

    def run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
            workdir: Path | None) -> ExecResult:
        uid, lock = self.pool.acquire() if self.pool else (None, -1)
        limiter = None
        try:
            wd = prepare_workdir(code, workdir, self.work_root, owner=uid, limits=limits)
            inp = wd / "input"
            inp.rmdir()
            if uid is not None:  # root-owned staging (staging.py): the run uid cannot write it
                os.symlink(stage_input(Path(input_dir), self.work_root), inp)
            else:  # the caller's own uid could write a shared staging dir: a private copy
                shutil.copytree(input_dir, inp, symlinks=True)
                for dirpath, _, _ in walk(inp):
                    os.chmod(dirpath, 0o555)
            path = os.path.dirname(os.path.abspath(self.python)) + ":/usr/local/bin:/usr/bin:/bin"
            tmp = str(wd / "tmp")
            limiter = RunLimiter(self.cgroups, limits, uid=uid, workdir=wd)
            status_r, status_w = os.pipe()
            # The launcher drops to the uid itself, after the join prefix (run as root) has put
            # the run into its cgroups.
            argv = limiter.argv_prefix() + launcher_argv(
                self.python, [self.python, PROGRAM_NAME], status_fd=status_w,
                rlimits=limits.rlimits(), uid=uid, nice=limits.nice)
            raw = run_process(argv, cwd=str(wd), env=sandbox_env(limits.threads, path, env,
                                                                 home=tmp, tmpdir=tmp),
                              timeout_s=limits.timeout_s, output_bytes=limits.output_bytes,
                              status_fd=(status_r, status_w), kill_tree=limiter.kill,
                              monitor=limiter)
            warnings = self.warnings + input_warnings(input_dir, check_others=uid is not None)
            return finish(raw, wd=wd, backend=self.name, limits=limits, warnings=warnings,
                          weak=True, limiter=limiter)
        finally:
            if limiter is not None:
                limiter.close()
            if self.pool is not None:
                self.pool.release(uid, lock)
