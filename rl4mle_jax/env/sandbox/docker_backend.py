"""Docker backend (docker SDK): one throw-away container per run, same contract as bwrap.

The container has no network, a read-only root, all capabilities dropped, no-new-privileges,
`--init` (so orphans are reaped), the workdir bound at /workdir and the data split bound
read-only at /workdir/input. It runs `python main.py` directly: the witness (launcher.py,
witness.py) is bwrap/subprocess-only for now, so `evidence` is None here.

The same limits as the other backends, as container options: the container's cgroup bounds
memory (mem_limit = memswap_limit: no swap), processes (pids_limit) and CPU (nano_cpus = cpus
cores); RLIMIT_FSIZE per file. Disk: /tmp is a container tmpfs of disk_mb / max_inodes (charged
to the container's memory); /workdir is a host bind, which is itself a size-limited tmpfs when
the host process is root (runfs.py) and shares its mount namespace with the Docker daemon;
otherwise the run dir is bounded per file only. peak_memory_mb is None (the container is gone
before its cgroup could be read); "oom" comes from Docker's State.OOMKilled.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.common import (
    PROGRAM_NAME,
    Limits,
    prepare_workdir,
    sandbox_env,
    sweep_leftovers,
)
from rl4mle_jax.env.sandbox.result import ExecResult, OutputCapture, classify, signal_name
from rl4mle_jax.env.sandbox.runfs import is_run_fs, regular_submission

CONTAINER_UID = 1000
LABEL = "rl4mle_jax.sandbox"


def _iso_seconds(a: str, b: str) -> float | None:
    """Seconds between two Docker timestamps (nanosecond ISO strings), None if unparsable."""
    try:
        ta, tb = (datetime.fromisoformat(t[:26].rstrip("Z") + "+00:00") for t in (a, b))
    except (ValueError, TypeError):
        return None
    dt = (tb - ta).total_seconds()
    return dt if dt >= 0 else None


class DockerBackend:
    """Runs programs in Docker containers; `client` may be injected (tests use a fake)."""

    name = "docker"
    mechanism = "docker container cgroup"

    def __init__(self, image: str, work_root: Path, client: Any = None):
        if client is None:
            import docker  # optional dependency: the `docker` extra

            client = docker.from_env(timeout=30)
            client.ping()  # raises when no engine answers
        self.client = client
        self.image = image
        self.work_root = work_root
        sweep_leftovers(work_root)

    def container_config(self, wd: Path, input_dir: Path, limits: Limits,
                         env: dict[str, str] | None) -> dict[str, Any]:
        """Keyword arguments of `containers.create` (public so tests can check the isolation)."""
        from docker.types import Ulimit

        user = CONTAINER_UID if os.geteuid() == 0 else os.getuid()
        ulimits = [Ulimit(name="core", soft=0, hard=0)]
        if limits.max_file_mb:
            n = int(limits.max_file_mb) << 20
            ulimits.append(Ulimit(name="fsize", soft=n, hard=n))
        cfg: dict[str, Any] = dict(
            image=self.image, command=["python", PROGRAM_NAME], working_dir="/workdir",
            user=f"{user}:{user}",
            environment=sandbox_env(limits.threads, "/usr/local/bin:/usr/bin:/bin", env),
            network_mode="none", read_only=True, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], init=True, ulimits=ulimits,
            tmpfs={"/tmp": ",".join(["rw", "nosuid", "nodev", "mode=1777"]
                                    + ([f"size={int(limits.disk_mb)}m"] if limits.disk_mb else [])
                                    + ([f"nr_inodes={int(limits.max_inodes)}"]
                                       if limits.max_inodes else []))},
            nano_cpus=int(limits.cpus * 1e9), labels={LABEL: "1"}, detach=True,
            volumes={str(wd): {"bind": "/workdir", "mode": "rw"},
                     str(Path(input_dir).resolve()): {"bind": "/workdir/input", "mode": "ro"}})
        if limits.memory_mb:
            cfg["mem_limit"] = cfg["memswap_limit"] = f"{int(limits.memory_mb)}m"
        if limits.max_procs:
            cfg["pids_limit"] = int(limits.max_procs)
        return cfg

    def run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
            workdir: Path | None) -> ExecResult:
        owner = CONTAINER_UID if os.geteuid() == 0 else None
        wd = prepare_workdir(code, workdir, self.work_root, owner=owner, limits=limits)
        disk = "host tmpfs" if is_run_fs(wd) else "per file only (RLIMIT_FSIZE)"
        cfg = self.container_config(wd, input_dir, limits, env)
        container = self.client.containers.create(**cfg)
        t0 = time.monotonic()
        timed_out = False
        try:
            container.start()
            try:
                exit_code = int(container.wait(timeout=limits.timeout_s)["StatusCode"])
            except Exception:  # requests' ReadTimeout / ConnectionError on timeout
                timed_out, exit_code = True, None
                container.kill()
            wall = time.monotonic() - t0
            container.reload()
            state = container.attrs.get("State", {})
            out, err = OutputCapture(limits.output_bytes), OutputCapture(limits.output_bytes)
            for cap, kw in ((out, {"stdout": True, "stderr": False}),
                            (err, {"stdout": False, "stderr": True})):
                for chunk in container.logs(stream=True, **kw):
                    cap.feed(chunk)
        finally:
            container.remove(force=True)
        if exit_code is not None and exit_code > 128:
            exit_code = -(exit_code - 128)  # the init process reports signals as 128 + signum
        duration = wall if timed_out else (
            _iso_seconds(state.get("StartedAt", ""), state.get("FinishedAt", "")) or wall)
        status = "oom" if state.get("OOMKilled") else classify(
            timed_out=timed_out, exit_code=exit_code, stderr_tail=err.raw_tail(4096),
            peak_memory_mb=None, memory_mb=limits.memory_mb)
        sub = wd / "submission" / "submission.csv"
        return ExecResult(
            status=status, exit_code=exit_code, duration_s=duration, stdout=out.text(),
            stderr=err.text(), submission_path=sub, submission_exists=regular_submission(wd),
            workdir=wd, backend=self.name, wall_s=wall,
            warnings=[f"aggregate limits: {self.mechanism}; run dir bound: {disk}, /tmp: "
                      "container tmpfs"],
            signal=signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None,
            stdout_bytes=out.total, stderr_bytes=err.total, stdout_truncated=out.truncated,
            stderr_truncated=err.truncated)
