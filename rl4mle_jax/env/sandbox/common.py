"""Pieces every backend shares: the working directory, the environment, the result."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl4mle_jax.env.sandbox.local import RawRun
from rl4mle_jax.env.sandbox.result import ExecResult, classify, signal_name
from rl4mle_jax.env.sandbox.runfs import mount_run_fs, regular_submission, sweep_run_fs, walk

if TYPE_CHECKING:
    from rl4mle_jax.env.sandbox.limiter import RunLimiter

log = logging.getLogger(__name__)

PROGRAM_NAME = "main.py"
MIN_INODES = 64  # the run dir's own skeleton and a few files
_LOGGED: set[tuple[str, str]] = set()
_STDERR_SCAN = 4096  # bytes of stderr's end searched for memory errors


@dataclass(frozen=True)
class Limits:
    """Per-run limits; memory_mb, cpus, max_procs, disk_mb and max_inodes bound the whole run
    (every process of it together) where the machine allows, see cgroups.py and runfs.py."""

    timeout_s: float
    memory_mb: int | None
    cpus: float
    max_procs: int | None
    max_file_mb: int | None
    output_bytes: int
    disk_mb: int | None = 1024
    max_inodes: int | None = 16384
    nice: int = 0  # added to the program's niceness (0-19): the host's own work goes first

    def __post_init__(self) -> None:
        if not self.cpus > 0:
            raise ValueError(f"cpus must be positive (cores), got {self.cpus}")
        if isinstance(self.nice, bool) or int(self.nice) != self.nice or not 0 <= self.nice <= 19:
            raise ValueError(f"nice must be an integer in 0..19, got {self.nice!r}")
        for name, least in (("memory_mb", 16), ("max_procs", 1), ("max_file_mb", 1),
                            ("disk_mb", 1), ("max_inodes", MIN_INODES)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or int(v) != v or v < least):
                raise ValueError(f"{name} must be None or an integer >= {least}, got {v!r}")

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus))

    def rlimits(self) -> dict[str, int]:
        """resource.RLIMIT_* name -> value, applied to the program only."""
        r = {"RLIMIT_CORE": 0}
        if self.memory_mb:
            r["RLIMIT_AS"] = int(self.memory_mb) << 20
        if self.max_file_mb:
            r["RLIMIT_FSIZE"] = int(self.max_file_mb) << 20
        if self.max_procs:
            r["RLIMIT_NPROC"] = int(self.max_procs)
        return r


def sweep_leftovers(work_root: Path) -> None:
    """At backend start: run dirs (tmpfs) of dead hosts and long-unused input staging dirs."""
    from rl4mle_jax.env.sandbox.staging import sweep_staging

    sweep_run_fs()
    sweep_staging(work_root)


def default_work_root() -> Path:
    return Path(os.environ.get("RL4MLE_SANDBOX_ROOT")
                or Path(tempfile.gettempdir()) / "rl4mle_sandbox")


def prepare_workdir(code: str, workdir: Path | None, work_root: Path,
                    owner: int | None = None, limits: Limits | None = None) -> Path:
    """Fresh <workdir>/{main.py, input/, submission/, tmp/}; owned by `owner` when given.

    With `limits` and root, the workdir is a tmpfs of limits.disk_mb / max_inodes (runfs.py).
    """
    if workdir is None:
        work_root.mkdir(parents=True, exist_ok=True)
        os.chmod(work_root, 0o711)  # other uids may enter their own run dir but not list others
        wd = Path(tempfile.mkdtemp(prefix="run_", dir=work_root))
    else:
        wd = Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        if any(wd.iterdir()):
            raise ValueError(f"workdir {wd} is not empty; the sandbox needs a fresh directory")
    if limits is not None:
        mount_run_fs(wd, limits.disk_mb, limits.max_inodes)
    for sub in ("input", "submission", "tmp", ".shm"):
        (wd / sub).mkdir()
    (wd / PROGRAM_NAME).write_text(code)
    os.chmod(wd, 0o755)
    if owner is not None:
        for p in (wd, wd / "submission", wd / "tmp", wd / ".shm", wd / PROGRAM_NAME):
            os.chown(p, owner, owner)
    return wd


def sandbox_env(threads: int, path: str, extra: dict[str, str] | None = None,
                home: str = "/tmp", tmpdir: str = "/tmp") -> dict[str, str]:
    """A clean environment: nothing of the host's leaks in (tokens, paths)."""
    n = str(threads)
    env = {
        "PATH": path, "HOME": home, "TMPDIR": tmpdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "USER": "sandbox", "LOGNAME": "sandbox",
        # Unbuffered: progress prints survive a timeout kill (the instrumentation reward
        # reads them).
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
        "NUMEXPR_NUM_THREADS": n, "VECLIB_MAXIMUM_THREADS": n, "LOKY_MAX_CPU_COUNT": n,
        # glibc reserves 64 MB of address space per malloc arena; keep RLIMIT_AS meaningful.
        "MALLOC_ARENA_MAX": "2",
        "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{tmpdir}/matplotlib",
    }
    env.update(extra or {})
    return env


def finish(raw: RawRun, *, wd: Path, backend: str, limits: Limits,
           warnings: list[str], weak: bool, limiter: RunLimiter | None = None) -> ExecResult:
    """Turn a finished RawRun into an ExecResult (limiter: the run's aggregate limits)."""
    st = raw.status
    hit = raw.limit_hit or (limiter.final_hit() if limiter is not None else None)
    if limiter is not None:
        warnings = [*limiter.notes, *warnings]
    if hit == "disk":
        warnings = [*warnings, f"run dir passed disk_mb={limits.disk_mb} or "
                               f"max_inodes={limits.max_inodes}: the run was ended"]
    elif hit == "oom":
        warnings = [*warnings, f"the run's processes together passed memory_mb="
                               f"{limits.memory_mb}: the run was ended"]
    if raw.timed_out:
        exit_code, duration = None, raw.killed_at_s or limits.timeout_s
    elif st is not None:
        # The launcher's own clock excludes sandbox set-up; the host's bounds it from above.
        exit_code, duration = st["exit_code"], min(max(st["duration_s"], 0.0), raw.wall_s)
    else:  # launcher killed or never started: the outer exit code is all we have
        rc = raw.outer_exit_code  # Popen: -signum; bwrap and the launcher: 128 + signum
        exit_code = -(rc - 128) if rc > 128 else rc
        duration = raw.wall_s
        warnings = [*warnings, "launcher reported no status; exit code from the sandbox process"]
    peak = st["maxrss_kb"] / 1024 if st is not None else None
    tree_peak = limiter.peak_memory_mb() if limiter is not None else None
    peak = tree_peak if tree_peak is not None else peak  # the whole tree's, when known
    status = classify(timed_out=raw.timed_out, exit_code=exit_code,
                      stderr_tail=raw.stderr.raw_tail(_STDERR_SCAN), peak_memory_mb=peak,
                      memory_mb=limits.memory_mb, limit_hit=hit)
    sub = wd / "submission" / "submission.csv"
    return ExecResult(
        status=status, exit_code=exit_code, duration_s=float(duration),
        stdout=raw.stdout.text(), stderr=raw.stderr.text(), submission_path=sub,
        submission_exists=regular_submission(wd), workdir=wd, backend=backend, wall_s=raw.wall_s,
        signal=signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None,
        peak_memory_mb=peak, cpu_s=st.get("cpu_s") if st is not None else None,
        stdout_bytes=raw.stdout.total, stderr_bytes=raw.stderr.total,
        stdout_truncated=raw.stdout.truncated, stderr_truncated=raw.stderr.truncated,
        weak_isolation=weak, warnings=list(warnings),
        evidence=st.get("evidence") if st is not None else None)


def input_warnings(input_dir: Path, check_others: bool) -> list[str]:
    """Problems that would make the program fail to read its input, said once per run.

    check_others: the program runs as another uid, so it needs the o+r / o+rx mode bits.
    """
    out = [f"input symlink {s} points outside the input dir and dangles in the sandbox"
           for s in escaping_symlinks(input_dir)]
    if check_others:
        bad = unreadable_by_others(input_dir)
        if bad:
            out.append(f"input not readable by the sandbox uid (needs o+r, dirs o+rx): "
                       f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}")
    for w in out:
        key = (str(input_dir), w)
        if key not in _LOGGED:  # once per input dir and problem; every result still says it
            _LOGGED.add(key)
            log.warning("sandbox input %s: %s", input_dir, w)
    return out


def unreadable_by_others(input_dir: Path) -> list[str]:
    bad = []
    for dirpath, _, filenames in walk(input_dir):
        if os.stat(dirpath).st_mode & 0o005 != 0o005:
            bad.append(str(Path(dirpath).relative_to(input_dir)) + "/")
        for name in filenames:
            p = Path(dirpath) / name
            if p.exists() and not p.stat().st_mode & 0o004:
                bad.append(str(p.relative_to(input_dir)))
    return bad


def escaping_symlinks(input_dir: Path) -> list[str]:
    """Symlinks in input_dir that point outside it (they dangle inside an isolating sandbox)."""
    root = input_dir.resolve()
    bad = []
    for dirpath, dirnames, filenames in walk(input_dir):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink() and not p.resolve().is_relative_to(root):
                bad.append(str(p.relative_to(input_dir)))
    return bad
