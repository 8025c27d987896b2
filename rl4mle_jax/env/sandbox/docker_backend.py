"""Docker backend (docker SDK): one throw-away container per run, same contract as bwrap.

The image is built locally, with no registry (scripts/docker_image.sh: the venv's interpreter
and the prompts' packages at the venv's versions, as rl4mle-sandbox:local). The container has no
network, a read-only root, all capabilities dropped but the two the launcher needs to drop its
uid, no-new-privileges, `--init` (so orphans are reaped), no log driver (output is streamed
through an attach, head and tail kept, so a flood fills no disk), the workdir bound at /workdir
and a staged copy of the data split (staging.py: no task path in mountinfo) read-only at
/workdir/input.

As root (CI, servers) the container runs the same launcher and witness as bwrap (launcher.py,
witness.py): it starts as container root with CAP_SETUID/CAP_SETGID only, drops to a per-run
uid from `UidPool` (so RLIMIT_NPROC is per run, as in bwrap), sets the rlimits (RLIMIT_AS =
memory_mb, ...) in the program only, and writes its status line (exit code, Δt, peak RSS, the
verified evidence) to <workdir>/.status/status: a root-owned 0700 directory the program cannot
read, write, rename or remove. As a normal user the program runs directly as the caller's uid,
without launcher or witness (`evidence` None: markers only), and says so in `warnings`.

The same limits as the other backends, as container options: the container's cgroup bounds
memory (mem_limit = memswap_limit: no swap), processes (pids_limit) and CPU (nano_cpus = cpus
cores; cpu_shares of a niced run, cgroups.cpu_weight); RLIMIT_FSIZE per file. Disk: /tmp is a
container tmpfs of disk_mb / max_inodes (charged to the container's memory); /workdir is a
host bind, which is itself a size-limited tmpfs when the host process is root (runfs.py) and
shares its mount namespace with the Docker daemon; otherwise the run dir is bounded per file
only. "oom" also comes from Docker's State.OOMKilled.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rl4mle_jax.env.sandbox.cgroups import cpu_weight
from rl4mle_jax.env.sandbox.common import (
    PROGRAM_NAME,
    Limits,
    input_warnings,
    prepare_workdir,
    sandbox_env,
    sweep_leftovers,
)
from rl4mle_jax.env.sandbox.launcher import launcher_argv, parse_status
from rl4mle_jax.env.sandbox.local import UidPool
from rl4mle_jax.env.sandbox.result import ExecResult, OutputCapture, classify, signal_name
from rl4mle_jax.env.sandbox.runfs import is_run_fs, regular_submission
from rl4mle_jax.env.sandbox.staging import stage_input

DEFAULT_IMAGE = "rl4mle-sandbox:local"  # scripts/docker_image.sh builds it
INNER_PYTHON = "/usr/local/bin/python"  # in the image
LABEL = "rl4mle_jax.sandbox"
STATUS_DIR = ".status"  # in the workdir: root, 0700; holds the launcher's status file
_STATUS_FD = 9  # the launcher's status fd inside the container
_STATUS_BYTES = 4096
_ATTACH_LINGER_S = 10.0  # after the container ended, for the last output to arrive


def _iso_seconds(a: str, b: str) -> float | None:
    """Seconds between two Docker timestamps (nanosecond ISO strings), None if unparsable."""
    try:
        ta, tb = (datetime.fromisoformat(t[:26].rstrip("Z") + "+00:00") for t in (a, b))
    except (ValueError, TypeError):
        return None
    dt = (tb - ta).total_seconds()
    return dt if dt >= 0 else None


def _launcher_command(limits: Limits, uid: int) -> list[str]:
    """The launcher's argv, preceded by opening the status file as fd _STATUS_FD (as root)."""
    argv = launcher_argv(INNER_PYTHON, [INNER_PYTHON, PROGRAM_NAME], status_fd=_STATUS_FD,
                         rlimits=limits.rlimits(), uid=uid, nice=limits.nice)
    assert argv[3] == "-c"
    opener = (f"import os as _o\n_f = _o.open({f'/workdir/{STATUS_DIR}/status'!r}, "
              "_o.O_WRONLY | _o.O_NOFOLLOW)\n"
              f"_o.dup2(_f, {_STATUS_FD}, inheritable=False)\n_o.close(_f)\ndel _o, _f\n")
    argv[4] = opener + argv[4]
    return argv


def _status_file(wd: Path) -> Path:
    """A root-owned, pre-filled status file (its pages exist: a full run dir cannot stop the
    launcher from writing its line); the program can neither reach nor replace it."""
    d = wd / STATUS_DIR
    d.mkdir(mode=0o700)
    os.chown(d, 0, 0)
    os.chmod(d, 0o700)
    f = d / "status"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, b"\n" * _STATUS_BYTES)
    finally:
        os.close(fd)
    return f


def _read_status(f: Path) -> dict | None:
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or st.st_nlink != 1:
            return None
        return parse_status(os.read(fd, _STATUS_BYTES))
    finally:
        os.close(fd)


class DockerBackend:
    """Runs programs in Docker containers; `client` may be injected (tests use a fake)."""

    name = "docker"
    mechanism = "docker container cgroup"

    def __init__(self, image: str, work_root: Path, client: Any = None):
        if client is None:
            import docker  # optional dependency: the `docker` extra

            client = docker.from_env(timeout=30)
            client.ping()  # raises when no engine answers
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                raise RuntimeError(
                    f"docker image {image!r} is not on this engine; build it (offline) with "
                    "`bash scripts/docker_image.sh`, or start an engine and build it with "
                    "`bash scripts/docker_engine.sh start`") from None
            self._sweep_containers(client)
        self.client = client
        self.image = image
        self.work_root = work_root
        self.privileged = os.geteuid() == 0
        self.pool = UidPool() if self.privileged else None
        sweep_leftovers(work_root)

    @staticmethod
    def _sweep_containers(client: Any) -> None:
        """Containers of ours that a dead host process left behind (never running ones)."""
        for status in ("created", "exited", "dead"):
            for c in client.containers.list(all=True, filters={"label": LABEL,
                                                               "status": status}):
                try:
                    c.remove(force=True)
                except Exception:
                    pass

    def container_config(self, wd: Path, input_dir: Path, limits: Limits,
                         env: dict[str, str] | None, uid: int | None = None) -> dict[str, Any]:
        """Keyword arguments of `containers.create` (public so tests can check the isolation).

        uid: the program's uid, dropped to by the launcher (host root); None: no launcher, the
        container runs as the caller's uid."""
        from docker.types import LogConfig, Ulimit

        ulimits = [Ulimit(name="core", soft=0, hard=0)]
        if limits.max_file_mb:
            n = int(limits.max_file_mb) << 20
            ulimits.append(Ulimit(name="fsize", soft=n, hard=n))
        if uid is not None:
            user, command, caps = "0:0", _launcher_command(limits, uid), ["SETUID", "SETGID"]
        else:
            me = os.getuid()
            user, command, caps = f"{me}:{me}", ["python", PROGRAM_NAME], []
        cfg: dict[str, Any] = dict(
            image=self.image, command=command, working_dir="/workdir", user=user,
            environment=sandbox_env(limits.threads, "/usr/local/bin:/usr/bin:/bin", env),
            network_mode="none", read_only=True, cap_drop=["ALL"], cap_add=caps,
            security_opt=["no-new-privileges"], init=True, ulimits=ulimits,
            log_config=LogConfig(type="none"),
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
        if limits.nice:  # niceness inside counts only within the container's own cgroup
            cfg["cpu_shares"] = cpu_weight(limits.nice, 1)
        return cfg

    def run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
            workdir: Path | None) -> ExecResult:
        uid, lock = self.pool.acquire() if self.pool else (None, -1)
        try:
            return self._run(code, input_dir, limits, env, workdir, uid)
        finally:
            if self.pool is not None:
                self.pool.release(uid, lock)

    def _run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
             workdir: Path | None, uid: int | None) -> ExecResult:
        wd = prepare_workdir(code, workdir, self.work_root, owner=uid, limits=limits)
        warnings = input_warnings(input_dir, check_others=uid is not None)
        status_file = _status_file(wd) if uid is not None else None
        if uid is None:
            warnings.append("docker: not root, so no launcher and no witness (markers only)")
        staged = stage_input(Path(input_dir), self.work_root)
        disk = "host tmpfs" if is_run_fs(wd) else "per file only (RLIMIT_FSIZE)"
        cfg = self.container_config(wd, staged, limits, env, uid=uid)
        container = self.client.containers.create(**cfg)
        out, err = OutputCapture(limits.output_bytes), OutputCapture(limits.output_bytes)
        timed_out, wall, state, reader = False, 0.0, {}, None
        try:
            reader = self._attach(container, out, err)
            t0 = time.monotonic()
            container.start()
            try:
                exit_code = int(container.wait(timeout=limits.timeout_s)["StatusCode"])
            except Exception:  # requests' ReadTimeout / ConnectionError on timeout
                timed_out, exit_code = True, None
                try:
                    container.kill()
                except Exception:  # it ended on its own meanwhile
                    pass
            wall = time.monotonic() - t0
            if reader is not None:
                reader.join(_ATTACH_LINGER_S)
            else:  # a client without attach (a test double): the logs, after the run
                for cap, kw in ((out, {"stdout": True, "stderr": False}),
                                (err, {"stdout": False, "stderr": True})):
                    for chunk in container.logs(stream=True, **kw):
                        cap.feed(chunk)
            container.reload()
            state = container.attrs.get("State", {})
        finally:
            container.remove(force=True)
            if reader is not None and reader.is_alive():
                reader.stream.close()  # type: ignore[attr-defined]
        st = _read_status(status_file) if status_file is not None else None
        if uid is not None and st is None and not timed_out:
            warnings.append("launcher reported no status; exit code from the container")
        if timed_out:
            duration = wall
        elif st is not None:  # the launcher's own clock, bounded by the host's
            exit_code, duration = st["exit_code"], min(max(st["duration_s"], 0.0), wall)
        else:
            if exit_code is not None and exit_code > 128:
                exit_code = -(exit_code - 128)  # init reports signals as 128 + signum
            duration = _iso_seconds(state.get("StartedAt", ""), state.get("FinishedAt", "")) \
                or wall
        peak = st["maxrss_kb"] / 1024 if st is not None else None
        status = "oom" if state.get("OOMKilled") else classify(
            timed_out=timed_out, exit_code=exit_code, stderr_tail=err.raw_tail(4096),
            peak_memory_mb=peak, memory_mb=limits.memory_mb)
        sub = wd / "submission" / "submission.csv"
        return ExecResult(
            status=status, exit_code=exit_code, duration_s=duration, stdout=out.text(),
            stderr=err.text(), submission_path=sub, submission_exists=regular_submission(wd),
            workdir=wd, backend=self.name, wall_s=wall, peak_memory_mb=peak,
            cpu_s=st.get("cpu_s") if st else None,
            warnings=[f"aggregate limits: {self.mechanism}; run dir bound: {disk}, /tmp: "
                      "container tmpfs", *warnings],
            signal=signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None,
            stdout_bytes=out.total, stderr_bytes=err.total, stdout_truncated=out.truncated,
            stderr_truncated=err.truncated, evidence=st.get("evidence") if st else None)

    @staticmethod
    def _attach(container: Any, out: OutputCapture, err: OutputCapture) -> threading.Thread | None:
        """Stream the container's stdout/stderr into the captures (attached before start)."""
        if not hasattr(container, "attach"):
            return None
        stream = container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)

        def pump() -> None:
            try:
                for o, e in stream:
                    if o:
                        out.feed(o)
                    if e:
                        err.feed(e)
            except Exception:  # the stream closed under us: what arrived is kept
                pass

        t = threading.Thread(target=pump, name="docker-attach", daemon=True)
        t.stream = stream  # type: ignore[attr-defined]  # closed once the container is gone
        t.start()
        return t
