"""Aggregate limits for a run's whole process tree: memory, CPU share, number of tasks.

One cgroup per run, chosen once per backend by `detect()`, in this order:
- "cgroup v2": a writable cgroup2 hierarchy whose own cgroup offers memory and pids (cpu when
  offered). Limits: memory.max (memory.swap.max = 0), pids.max, cpu.max (and cpu.weight for a
  niced run, below); memory.oom.group = 1
  so an OOM kills the whole run. Peak = memory.peak, OOM = memory.events oom_kill, the end =
  cgroup.kill.
  If the host's own cgroup holds only the host process, the host moves itself into a leaf
  `rl4mle-host` so that controllers can be enabled below it (the no-internal-process rule).
- "cgroup v1": the memory, pids and cpu hierarchies (root, or a delegated v1 tree). Limits:
  memory.limit_in_bytes (+ memsw), pids.max, cpu.cfs_quota_us (+ cpu.shares); peak =
  memory.max_usage_in_bytes, OOM = memory.oom_control oom_kill (the host then kills the rest of
  the tree, as oom.group would). The end kills every pid in cgroup.procs until it is empty.
- "watchdog" (no writable cgroups: unprivileged without delegation): see watchdog.py; memory
  is polled, CPU share is only the thread-count environment, processes only RLIMIT_NPROC.

The dev/CI machine (root in a container): cgroup v1 for memory, pids and cpu is writable (the
memory cgroup nests under our own, /process_api/<id>); its cgroup2 mount has no controllers, so
v2 is skipped. Users' servers usually have pure v2 (delegated to the user or not).

The run joins its cgroups before it can fork: its argv starts with `sh -c` that writes "0" (the
writer itself) into each cgroup and then execs the sandbox (no preexec_fn: runs come from threads).
In v1 it writes to `tasks`, not `cgroup.procs`: moving a whole process (cgroup.procs, or any pid
but 0) write-locks the global cgroup_threadgroup_rwsem, and once that lock has been idle for a
few ms the write waits one RCU grace period (measured here: 8-10 ms per run, wherever the cgroup
came from; 0.2 ms when another migration ran within ~10 ms). "0" in `tasks` moves only the
calling thread and takes no global lock (cgroup_procs_write_start: pid 0 and no threadgroup;
in the 6.18 kernel here, upstream since ~6.2; older kernels lock either way, so nothing is
lost); the shell is single-threaded, so this moves all of it, and exec keeps it there.
cgroup2 allows thread moves only inside threaded subtrees, so v2 writes cgroup.procs and pays
that grace period unless the host mounts cgroup2 with `favordynmods` (cgroup.procs writes then
take a per-process lock; on kernels >= 6.18 a one-way switch until reboot).
Cgroups are named rl4mle-<pid namespace>-<host pid>-<host start time>-<seq>; `sweep()` removes
those of dead hosts in our pid namespace, so a killed host leaks nothing past the next start.
tmpfs pages the run writes (its run dir, runfs.py) are charged to its memory cgroup.

Niceness (Limits.nice) orders tasks only within their own cgroup: the scheduler weighs a run's
cgroup against the host's processes as one nice-0 task, whatever the niceness inside. So a
niced run's cgroup gets the weight the kernel gives that niceness (about 1/1.25 per level:
cpu.shares in v1, cpu.weight (100 = nice 0) in v2), and the host's work goes first.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "rl4mle-"
SANDBOX_TASKS = 8  # sh/bwrap, bwrap's pid 1, the launcher: on top of the program's max_procs
CFS_PERIOD_US = 100_000
_V1_CONTROLLERS = ("memory", "pids", "cpu")
_SEQ = itertools.count()
_SEQ_LOCK = threading.Lock()
# Writes 0 (= the writing shell, which exec keeps) into each file named before "--":
# v1 `tasks` (moves the calling thread, no global lock) or v2 `cgroup.procs` (the process).
JOIN_SCRIPT = ('while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '
               'exec "$@"')


# The kernel's weight of a task at nice 0..19 (kernel/sched/core.c, sched_prio_to_weight).
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29,
                23, 18, 15)


def cpu_weight(nice: int, version: int) -> int:
    """The cgroup CPU weight that weighs a run like one task at `nice`: v1 cpu.shares (1024 =
    nice 0), v2 cpu.weight (100 = nice 0, least 1)."""
    w = NICE_WEIGHTS[nice]
    return w if version == 1 else max(1, round(w * 100 / 1024))


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _start_time(pid: int) -> str | None:
    try:
        return _read(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")


def host_tag() -> str:
    """<pid namespace>-<pid>-<start time> of this host process (names its cgroups and mounts)."""
    return f"{_pid_ns()}-{os.getpid()}-{_start_time(os.getpid())}"


def stale_host(tag: str) -> bool:
    """Is `tag` (host_tag) a host process of our pid namespace that is no longer alive?"""
    parts = tag.split("-")
    if len(parts) != 3 or parts[0] != _pid_ns() or not parts[1].isdigit():
        return False
    return _start_time(int(parts[1])) != parts[2]


def _stale(name: str) -> bool:
    """A run cgroup (<PREFIX><host tag>-<seq>) of a dead host."""
    return name.startswith(PREFIX) and stale_host(name[len(PREFIX):].rpartition("-")[0])


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of cgroup mounts."""
    out = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> our cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            out[c] = path
    return out


def _base(mount: str, own: str) -> Path:
    d = Path(mount) / own.lstrip("/")
    return d if d.is_dir() else Path(mount)


class RunCgroup:
    """The cgroup(s) of one run: join prefix, OOM polling, peak, kill, removal."""

    def __init__(self, version: int, dirs: list[Path]):
        self.version, self.dirs = version, dirs
        self.mechanism = f"cgroup v{version}"
        self.mem = next((d for d in dirs if (d / ("memory.max" if version == 2 else
                                                  "memory.limit_in_bytes")).exists()), None)

    def join_files(self) -> list[Path]:
        """Where the run's first process writes "0" to join (see the module docstring)."""
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [d / name for d in self.dirs]

    def argv_prefix(self) -> list[str]:
        return ["/bin/sh", "-c", JOIN_SCRIPT, "sh", *map(str, self.join_files()), "--"]

    def oom_kills(self) -> int:
        if self.mem is None:
            return 0
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(self.mem / name).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def poll(self) -> str | None:
        """"oom" once the kernel OOM-killed anything in the run (then the run is ended)."""
        return "oom" if self.oom_kills() > 0 else None

    def peak_memory_mb(self) -> float | None:
        if self.mem is None:
            return None
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(self.mem / name)) / (1 << 20)
        except (OSError, ValueError):
            return None

    def kill(self, rounds: int = 100) -> None:
        """SIGKILL every task in the run's cgroups until none is left (pids.max bounds refills)."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                _write(self.dirs[0] / "cgroup.kill", "1")
            except OSError:
                pass
        seen: set[int] = set()
        for _ in range(rounds):
            pids = set()
            for d in self.dirs:
                try:
                    pids.update(int(p) for p in _read(d / "cgroup.procs").split())
                except OSError:
                    pass
            if not pids - seen:  # nothing new: what is listed is already dying (remove waits)
                return
            for pid in pids - seen:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            seen |= pids
            time.sleep(0.001)

    def remove(self, timeout_s: float = 2.0) -> bool:
        """Kill what is left and rmdir; False (and a log line) if a cgroup stays behind."""
        deadline = time.monotonic() + timeout_s
        left = list(self.dirs)
        while left:
            self.kill()
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError:  # EBUSY until the killed tasks are gone
                    pass
            if left and time.monotonic() > deadline:
                log.warning("sandbox cgroups not removed (next start sweeps them): %s", left)
                return False
            if left:
                time.sleep(0.01)
        return True


class Cgroups:
    """Where run cgroups are made on this machine, and how (see the module docstring)."""

    def __init__(self, version: int, bases: list[Path]):
        self.version, self.bases = version, bases
        self.mechanism = f"cgroup v{version}"
        self.tag = host_tag()

    def create(self, memory_mb: int | None, cpus: float | None,
               max_procs: int | None, nice: int = 0) -> RunCgroup:
        with _SEQ_LOCK:
            name = f"{PREFIX}{self.tag}-{next(_SEQ)}"
        dirs: list[Path] = []
        try:
            for base in self.bases:
                d = base / name
                d.mkdir()
                dirs.append(d)
            run = RunCgroup(self.version, dirs)
            if self.version == 2:
                self._limit_v2(dirs[0], memory_mb, cpus, max_procs)
                if nice and (dirs[0] / "cpu.weight").exists():
                    _write(dirs[0] / "cpu.weight", str(cpu_weight(nice, 2)))
            else:
                self._limit_v1(dirs, memory_mb, cpus, max_procs)
                for d in dirs:
                    if nice and (d / "cpu.shares").exists():
                        _write(d / "cpu.shares", str(cpu_weight(nice, 1)))
        except BaseException:
            RunCgroup(self.version, dirs).remove()
            raise
        return run

    @staticmethod
    def _limit_v2(d: Path, memory_mb: int | None, cpus: float | None,
                  max_procs: int | None) -> None:
        if memory_mb:
            _write(d / "memory.max", str(int(memory_mb) << 20))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            if (d / "memory.oom.group").exists():
                _write(d / "memory.oom.group", "1")
        if max_procs:
            _write(d / "pids.max", str(int(max_procs) + SANDBOX_TASKS))
        if cpus and (d / "cpu.max").exists():
            _write(d / "cpu.max", f"{max(1000, int(cpus * CFS_PERIOD_US))} {CFS_PERIOD_US}")

    @staticmethod
    def _limit_v1(dirs: list[Path], memory_mb: int | None, cpus: float | None,
                  max_procs: int | None) -> None:
        for d in dirs:
            if memory_mb and (d / "memory.limit_in_bytes").exists():
                _write(d / "memory.limit_in_bytes", str(int(memory_mb) << 20))
                try:  # swap accounting is often off: then there is no swap to limit
                    _write(d / "memory.memsw.limit_in_bytes", str(int(memory_mb) << 20))
                except OSError:
                    pass
            if max_procs and (d / "pids.max").exists():
                _write(d / "pids.max", str(int(max_procs) + SANDBOX_TASKS))
            if cpus and (d / "cpu.cfs_quota_us").exists():
                _write(d / "cpu.cfs_period_us", str(CFS_PERIOD_US))
                _write(d / "cpu.cfs_quota_us", str(max(1000, int(cpus * CFS_PERIOD_US))))

    def sweep(self) -> int:
        """Remove run cgroups left by dead hosts (a SIGKILLed trainer); returns how many."""
        removed = 0
        for base in self.bases:
            try:
                names = [e.name for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for name in names:
                if _stale(name) and RunCgroup(self.version, [base / name]).remove(0.5):
                    removed += 1
        return removed


def _v2() -> Cgroups:
    mount = next((m for m, t, _ in _mounts() if t == "cgroup2"), None)
    if mount is None:
        raise OSError("no cgroup2 mount")
    base = _base(mount, _own_paths().get("", "/"))
    have = set(_read(base / "cgroup.controllers").split())
    if not {"memory", "pids"} <= have:
        raise OSError(f"cgroup2 at {base} offers {sorted(have) or 'no controllers'}")
    want = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in have)
    try:
        _write(base / "cgroup.subtree_control", want)
    except OSError:
        # No internal processes: if we are alone here, move into a leaf and retry.
        procs = _read(base / "cgroup.procs").split()
        if procs != [str(os.getpid())]:
            raise
        leaf = base / "rl4mle-host"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(base / "cgroup.subtree_control", want)
    return Cgroups(2, [base])


def _v1() -> Cgroups:
    own = _own_paths()
    bases = []
    for ctrl in _V1_CONTROLLERS:
        mount = next((m for m, t, o in _mounts() if t == "cgroup" and ctrl in o), None)
        if mount is None:
            raise OSError(f"no cgroup v1 {ctrl} hierarchy")
        base = _base(mount, own.get(ctrl, "/"))
        if base not in bases:
            bases.append(base)
    return Cgroups(1, bases)


_DETECTED: list[tuple[Cgroups | None, list[str]]] = []  # once per host process
_DETECT_LOCK = threading.Lock()


def detect() -> tuple[Cgroups | None, list[str]]:
    """The usable cgroup flavour here (probed by making one run cgroup), or None; and why not."""
    with _DETECT_LOCK:
        if not _DETECTED:
            why: list[str] = []
            found = None
            for make in (_v2, _v1):
                try:
                    cg = make()
                    cg.create(64, 1.0, 16).remove()
                    found = cg
                    break
                except OSError as e:
                    why.append(f"{make.__name__.strip('_')}: {e}")
            if found is not None:
                found.sweep()
            _DETECTED.append((found, why))
        return _DETECTED[0][0], list(_DETECTED[0][1])
