"""Sandboxed execution of one untrusted Python program per call.

    sb = Sandbox(backend="bwrap", timeout_s=300, memory_mb=8192, cpus=1)
    res = sb.run(code, input_dir)                      # thread-safe
    res = await sb.arun(code, input_dir)               # many at once from asyncio
    res.status, res.duration_s, res.submission_exists, res.submission_path; res.cleanup()

The program runs with cwd = a fresh workdir holding `input/` (read-only view of input_dir) and
`submission/` (writable); it writes `./submission/submission.csv`. The workdir is kept for the
caller, who deletes it (`ExecResult.cleanup()`) after reading the submission.
Backends: "bwrap" (default; namespaces, see bwrap.py), "subprocess" (rlimits only, says loudly
that it is weaker), "docker" (docker SDK), "ray" (each run a Ray task running one of the others
on a node of a cluster, graded here; ray_backend.py).

Aggregate limits (the whole process tree of a run, not each process): memory_mb, cpus (cores:
a CFS quota of cpus x period), max_procs (pids.max) through a per-run cgroup, v2 where writable,
else v1 (this dev/CI machine, root in a container), else a host-side watchdog (cgroups.py,
watchdog.py); disk_mb and max_inodes through a tmpfs on the run dir as root, else the
watchdog's scan (runfs.py). `repr(sb)` and every ExecResult.warnings name the mechanism used.
memory_mb is also each process's RLIMIT_AS (a clean MemoryError before the tree limit).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.common import Limits, default_work_root
from rl4mle_jax.env.sandbox.result import STATUSES, ExecResult

log = logging.getLogger(__name__)

__all__ = ["Sandbox", "ExecResult", "STATUSES", "BACKENDS"]

BACKENDS = ("bwrap", "subprocess", "docker", "ray")


def parse_preimport(preimport: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
    """Module names from a comma-separated string or a sequence; each must be a dotted name."""
    names = preimport.split(",") if isinstance(preimport, str) else list(preimport)
    out = tuple(n.strip() for n in names if n.strip())
    bad = [n for n in out if not all(p.isidentifier() for p in n.split("."))]
    if bad:
        raise ValueError(f"preimport: not module names: {bad}")
    return out


class Sandbox:
    """Runs untrusted programs with limits; see the module docstring.

    memory_mb: memory of the whole run (cgroup; also each process's RLIMIT_AS). cpus: cores the
    run may use (CFS quota), and the OMP/MKL/OpenBLAS thread counts. max_procs: processes +
    threads of the run. max_file_mb: largest file it may write. disk_mb / max_inodes: bytes and
    entries of its whole run dir (tmpfs). output_bytes: kept per stream (head+tail). nice: added
    to the program's niceness (0-19), so work of the host on the same cores (a learner on CPU)
    goes first.
    python: host interpreter whose libraries programs may import (default: this one).
    image: the "docker" backend's image (built locally by scripts/docker_image.sh).
    ray_inner / ray_address: the "ray" backend's sandbox on each node, and the cluster to join
    (default: $RAY_ADDRESS, else a local Ray started here; see ray_backend.py).
    preimport: modules ("pandas,sklearn.ensemble" or a tuple) that the "bwrap" backend imports
    once into a zygote, which forks each program into its run's sandbox instead of a fresh
    interpreter re-importing them (as root; a normal user's runs start fresh, and say so in their
    warnings; other backends ignore it with a warning; see zygote.py).
    """

    def __init__(self, backend: str = "bwrap", timeout_s: float = 300.0,
                 memory_mb: int | None = 8192, cpus: float = 1.0, max_procs: int | None = 256,
                 max_file_mb: int | None = 1024, output_bytes: int = 256 * 1024,
                 disk_mb: int | None = 1024, max_inodes: int | None = 16384, nice: int = 0,
                 python: str | None = None, work_root: str | Path | None = None,
                 image: str = "rl4mle-sandbox:local", max_concurrency: int = 64,
                 docker_client: Any = None, ray_inner: str = "bwrap",
                 ray_address: str | None = None, preimport: str | tuple[str, ...] = ""):
        if backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        preimport = parse_preimport(preimport)
        if preimport and backend != "bwrap":
            # an optimisation, not a change of what runs: other backends start programs fresh
            log.warning("sandbox: preimport is a feature of the bwrap backend; the %s backend "
                        "starts every program fresh", backend)
        self.backend_name = backend
        self.limits = Limits(timeout_s=float(timeout_s), memory_mb=memory_mb, cpus=float(cpus),
                             max_procs=max_procs, max_file_mb=max_file_mb,
                             output_bytes=int(output_bytes), disk_mb=disk_mb,
                             max_inodes=max_inodes, nice=nice)
        self.python = python or sys.executable
        self.work_root = Path(work_root) if work_root is not None else default_work_root()
        if backend == "bwrap":
            from rl4mle_jax.env.sandbox.bwrap import BwrapBackend

            self._backend: Any = BwrapBackend(self.python, self.work_root,
                                              preimport=preimport)
        elif backend == "subprocess":
            from rl4mle_jax.env.sandbox.subprocess_backend import SubprocessBackend

            self._backend = SubprocessBackend(self.python, self.work_root)
        elif backend == "ray":
            from rl4mle_jax.env.sandbox.ray_backend import RayBackend

            self._backend = RayBackend(self.work_root, inner=ray_inner, address=ray_address)
        else:
            from rl4mle_jax.env.sandbox.docker_backend import DockerBackend

            self._backend = DockerBackend(image, self.work_root, client=docker_client)
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency,
                                            thread_name_prefix="sandbox")

    def run(self, code: str, input_dir: str | Path, timeout_s: float | None = None,
            env: dict[str, str] | None = None, workdir: str | Path | None = None) -> ExecResult:
        """Run `code` as ./main.py; blocks until it ends or times out."""
        input_dir = Path(input_dir)
        if not input_dir.is_dir():
            raise FileNotFoundError(f"sandbox input_dir {input_dir} is not a directory")
        target = Path(workdir) if workdir is not None else self.work_root
        if target.resolve().is_relative_to(input_dir.resolve()):
            kind = "workdir" if workdir is not None else "work_root"
            raise ValueError(f"sandbox {kind} {target} lies inside input_dir {input_dir}; the "
                             "program would see (and a copy would recurse into) its own runs")
        limits = self.limits
        if timeout_s is not None:
            if timeout_s <= 0:
                raise ValueError(f"timeout_s must be positive, got {timeout_s}")
            limits = Limits(**{**limits.__dict__, "timeout_s": float(timeout_s)})
        return self._backend.run(code, input_dir, limits, env,
                                 Path(workdir) if workdir is not None else None)

    async def arun(self, code: str, input_dir: str | Path, timeout_s: float | None = None,
                   env: dict[str, str] | None = None,
                   workdir: str | Path | None = None) -> ExecResult:
        """`run` on the sandbox's own thread pool (max_concurrency at once), awaitable."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self.run, code, input_dir, timeout_s=timeout_s, env=env,
                                 workdir=workdir)
        return await loop.run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
        if hasattr(self._backend, "close"):
            self._backend.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mech = getattr(self._backend, "mechanism", "?")
        zygote = getattr(self._backend, "zygote", None)
        pre = f", programs forked from a zygote preloading {zygote.modules}" if zygote else ""
        return f"Sandbox(backend={self.backend_name!r}, limits by {mech}{pre}, {self.limits})"
