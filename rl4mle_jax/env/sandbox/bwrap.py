"""bubblewrap backend: a fresh mount/pid/net/ipc/uts namespace per run, built from an empty root.

What the program sees (everything else of the host does not exist for it):
  /usr, /bin, /lib*          read-only (system libraries and tools)
  /etc                       a handful of files (ld.so cache, localtime) + a synthetic passwd
  /opt/python                read-only: the interpreter's base install (may live under /root)
  /opt/venv                  read-only: only the venv's site-packages, plus a synthetic pyvenv.cfg
  /workdir                   the run's working directory (cwd), writable
  /workdir/input             read-only bind of the data split
  /tmp                       = <workdir>/tmp (so nothing outside the workdir is writable)
  /proc, /dev                fresh, showing only the sandbox's own processes / basic devices
No network namespace peers: loopback is refused and DNS fails. A seccomp filter (seccomp.py)
refuses new namespaces, io_uring, bpf, perf events, keyrings and mount calls.

Two modes. As root (CI, servers) bwrap runs privileged without a user namespace and the launcher
drops to a per-run uid from `UidPool`: the kernel does not enforce RLIMIT_NPROC for uid 0, even
inside a user namespace. As a normal user, bwrap maps the caller's uid via `--unshare-user`.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, replace
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
from rl4mle_jax.env.sandbox.launcher import launch_config, launcher_argv
from rl4mle_jax.env.sandbox.limiter import RunLimiter
from rl4mle_jax.env.sandbox.local import UidPool, run_process
from rl4mle_jax.env.sandbox.result import ExecResult
from rl4mle_jax.env.sandbox.seccomp import build_filter, filter_fd
from rl4mle_jax.env.sandbox.staging import stage_input
from rl4mle_jax.env.sandbox.zygote import Handoff, Zygote

log = logging.getLogger(__name__)

SANDBOX_WORKDIR = "/workdir"
_SYSTEM_TOP = ("/usr",)
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/nsswitch.conf", "/etc/alternatives", "/etc/mime.types")


@dataclass(frozen=True)
class PythonLayout:
    """Where a host interpreter lives, and where it appears inside the sandbox."""

    host_exe: str  # realpath of the host binary
    base_prefix: str
    prefix: str
    version: str  # "3.11"
    site_packages: tuple[str, ...]  # host dirs under `prefix` (venv only)
    include_system_site: bool

    @property
    def is_venv(self) -> bool:
        return os.path.realpath(self.prefix) != os.path.realpath(self.base_prefix)

    @property
    def base_bound(self) -> bool:
        """False when the base install already sits under /usr (bound anyway)."""
        return not any(self.base_prefix == d or self.base_prefix.startswith(d + "/")
                       for d in _SYSTEM_TOP)

    @property
    def inner_base_exe(self) -> str:
        if not self.base_bound:
            return self.host_exe
        rel = os.path.relpath(self.host_exe, self.base_prefix)
        if rel.startswith(".."):
            raise ValueError(f"interpreter {self.host_exe} lies outside its prefix "
                             f"{self.base_prefix}")
        return f"/opt/python/{rel}"

    @property
    def inner_exe(self) -> str:
        """The interpreter path the program is started with inside the sandbox."""
        return "/opt/venv/bin/python" if self.is_venv else self.inner_base_exe


_QUERY = (
    "import json, os, site, sys; cfg = os.path.join(sys.prefix, 'pyvenv.cfg'); "
    "inc = os.path.exists(cfg) and 'include-system-site-packages = true' in open(cfg).read(); "
    "print(json.dumps({'host_exe': os.path.realpath(sys.executable),"
    " 'base_prefix': sys.base_prefix, 'prefix': sys.prefix,"
    " 'version': '%d.%d' % sys.version_info[:2],"
    " 'site_packages': [p for p in site.getsitepackages() if os.path.isdir(p)],"
    " 'include_system_site': inc}))"
)


@functools.lru_cache(maxsize=16)
def query_python(python: str) -> PythonLayout:
    """Ask a host interpreter where its pieces are (cached per path)."""
    out = subprocess.run([python, "-c", _QUERY], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"cannot query interpreter {python!r}: {out.stderr.strip()}")
    d = json.loads(out.stdout)
    prefix = os.path.realpath(d["prefix"])
    sp = tuple(dict.fromkeys(os.path.realpath(p) for p in d["site_packages"]
                             if os.path.realpath(p).startswith(prefix + "/")))
    return PythonLayout(host_exe=d["host_exe"], base_prefix=os.path.realpath(d["base_prefix"]),
                        prefix=prefix, version=d["version"], site_packages=sp,
                        include_system_site=bool(d["include_system_site"]))


def _data_fd(text: str) -> int:
    """A pipe read end holding `text` (for bwrap's --ro-bind-data); small texts fit the buffer."""
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return r


class MountPlan:
    """Accumulates bwrap arguments; creates parent directories with mode 0755 explicitly
    (bwrap would make them 0700, which the unprivileged uid could not traverse)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.fds: list[int] = []
        self._dirs: set[str] = {"/"}

    def dir(self, path: str) -> None:
        if path in self._dirs:
            return
        self.dir(os.path.dirname(path))
        self.args += ["--perms", "0755", "--dir", path]
        self._dirs.add(path)

    def bind(self, src: str, dest: str, ro: bool = True, try_: bool = False) -> None:
        self.dir(os.path.dirname(dest))
        flag = ("--ro-bind" if ro else "--bind") + ("-try" if try_ else "")
        self.args += [flag, src, dest]
        self._dirs.add(dest)

    def data(self, text: str, dest: str) -> None:
        self.dir(os.path.dirname(dest))
        fd = _data_fd(text)
        self.fds.append(fd)
        self.args += ["--perms", "0444", "--ro-bind-data", str(fd), dest]

    def symlink(self, target: str, dest: str) -> None:
        self.dir(os.path.dirname(dest))
        self.args += ["--symlink", target, dest]


def bwrap_argv(*, bwrap: str, layout: PythonLayout, workdir: Path, input_dir: Path,
               privileged: bool, inner_uid: int,
               hostname: str = "sandbox") -> tuple[list[str], list[int]]:
    """bwrap arguments (up to and excluding the command) and the fds they reference."""
    p = MountPlan()
    if privileged:
        ns = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        ns = ["--unshare-all", "--unshare-user", "--uid", str(inner_uid), "--gid", str(inner_uid),
              "--disable-userns"]
    args = [bwrap, *ns, "--die-with-parent", "--new-session", "--hostname", hostname]
    _system_mounts(p, layout, inner_uid)
    p.bind(str(workdir), SANDBOX_WORKDIR, ro=False)
    p.bind(str(input_dir), f"{SANDBOX_WORKDIR}/input")
    p.bind(str(workdir / "tmp"), "/tmp", ro=False)
    p.bind("/sys/devices/system/cpu", "/sys/devices/system/cpu", try_=True)
    args += p.args
    seccomp = filter_fd()
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
        p.fds.append(seccomp)
    # POSIX semaphores (multiprocessing, joblib) need a writable /dev/shm: keep it in the workdir.
    args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workdir / ".shm"), "/dev/shm",
             "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR]
    return args, p.fds


def zygote_bwrap_argv(*, bwrap: str, layout: PythonLayout) -> tuple[list[str], list[int]]:
    """bwrap arguments and the interpreter for the zygote (zygote.py): the runs' system, Python
    and venv mounts at the same paths; no network; the host's pid namespace (it forks into the
    runs' own); root with the capabilities to enter the runs' namespaces; no seccomp filter (it
    refuses setns: each child installs it once inside)."""
    p = MountPlan()
    args = [bwrap, "--unshare-net", "--unshare-ipc", "--unshare-uts", "--new-session",
            "--hostname", "sandbox-zygote"]
    for cap in ("CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETUID", "CAP_SETGID"):
        args += ["--cap-add", cap]
    _system_mounts(p, layout, 0)
    p.bind("/sys/devices/system/cpu", "/sys/devices/system/cpu", try_=True)
    args += p.args + ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--remount-ro", "/",
                      "--chdir", "/"]
    return args + [layout.inner_exe], p.fds


def _system_mounts(p: MountPlan, layout: PythonLayout, inner_uid: int) -> None:
    for top in _SYSTEM_TOP:
        p.bind(top, top)
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            p.symlink(os.readlink(link), link)
        elif os.path.isdir(link):
            p.bind(link, link)
    for f in _ETC_FILES:
        if os.path.exists(f):
            p.bind(f, f)
    p.data(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
           f"sandbox:x:{inner_uid}:{inner_uid}:sandbox:/tmp:/usr/sbin/nologin\n", "/etc/passwd")
    p.data(f"root:x:0:\nsandbox:x:{inner_uid}:\n", "/etc/group")
    p.data("127.0.0.1 localhost\n::1 localhost\n", "/etc/hosts")
    if layout.base_bound:
        p.bind(layout.base_prefix, "/opt/python")
    if layout.is_venv:
        for sp in layout.site_packages:
            p.bind(sp, "/opt/venv/" + os.path.relpath(sp, layout.prefix))
        p.symlink(layout.inner_base_exe, "/opt/venv/bin/python")
        p.symlink("python", f"/opt/venv/bin/python{layout.version}")
        p.symlink("python", "/opt/venv/bin/python3")
        home = os.path.dirname(layout.inner_base_exe)
        inc = "true" if layout.include_system_site else "false"
        p.data(f"home = {home}\ninclude-system-site-packages = {inc}\n", "/opt/venv/pyvenv.cfg")


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


class BwrapBackend:
    """Runs programs under bubblewrap (see the module docstring for what they see)."""

    name = "bwrap"

    def __init__(self, python: str, work_root: Path, bwrap: str | None = None,
                 preimport: tuple[str, ...] = ()):
        found = bwrap or find_bwrap()
        if found is None:
            raise RuntimeError("bubblewrap (bwrap) not found: `apt-get install bubblewrap`, or use "
                               "Sandbox(backend='subprocess') (weaker isolation)")
        self.bwrap = found
        self.layout = query_python(python)
        self.work_root = work_root
        self.privileged = os.geteuid() == 0
        self.pool = UidPool() if self.privileged else None
        self.cgroups, self.cgroup_notes = detect()
        self.mechanism = self.cgroups.mechanism if self.cgroups is not None else "watchdog"
        sweep_leftovers(work_root)
        self._checked = False
        self._check_lock = threading.Lock()
        self.zygote: Zygote | None = None
        self.notes: list[str] = []
        if preimport and not self.privileged:
            # As a normal user each run lives in its own user namespace, which a sibling cannot
            # enter: fresh interpreters, as without preimport, and every result says so.
            self.notes.append("preimport ignored: forking from a pre-imported interpreter "
                              "needs root (privileged bwrap); programs start fresh")
            log.warning("sandbox: %s", self.notes[-1])
        elif preimport:
            self.zygote = Zygote(
                functools.partial(zygote_bwrap_argv, bwrap=self.bwrap, layout=self.layout),
                tuple(preimport), sandbox_env(1, self._path(), self._extra_env({})),
                build_filter())

    def _path(self) -> str:
        path = "/usr/local/bin:/usr/bin:/bin"
        if self.layout.is_venv:
            return "/opt/venv/bin:" + path
        if self.layout.base_bound:
            return os.path.dirname(self.layout.inner_base_exe) + ":" + path
        return path

    def _extra_env(self, env: dict[str, str] | None) -> dict[str, str]:
        env = dict(env or {})
        if self.layout.base_bound and glob.glob(f"{self.layout.base_prefix}/lib/libpython*"):
            # Its RUNPATH names the host path, absent here: without this the loader would
            # pick the system's libpython (another patch release) under our stdlib.
            env.setdefault("LD_LIBRARY_PATH", "/opt/python/lib")
        return env

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()

    def _check(self, limits: Limits) -> None:
        """Once: a trivial program must run, or bwrap's own complaint is raised."""
        with self._check_lock:
            if self._checked:
                return
            with tempfile.TemporaryDirectory() as d:
                os.chmod(d, 0o755)
                res = self._run("pass", Path(d), replace(limits, timeout_s=60), None, None)
                res.cleanup()
            if res.status != "ok":
                raise RuntimeError(f"the bwrap sandbox does not work here ({res.status}, "
                                   f"exit {res.exit_code}): {res.stderr.strip()[-2000:]}")
            self._checked = True

    def run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
            workdir: Path | None) -> ExecResult:
        if not self._checked:
            self._check(limits)
        return self._run(code, input_dir, limits, env, workdir)

    def _run(self, code: str, input_dir: Path, limits: Limits, env: dict[str, str] | None,
             workdir: Path | None) -> ExecResult:
        uid, lock = self.pool.acquire() if self.pool else (None, -1)
        limiter = handoff = None
        try:
            wd = prepare_workdir(code, workdir, self.work_root, owner=uid, limits=limits)
            warnings = self.notes + input_warnings(input_dir, check_others=uid is not None)
            inner_uid = uid if uid is not None else 1000
            # A staged copy: mountinfo names the bind source, which must not be the task's path.
            staged = stage_input(Path(input_dir), self.work_root)
            limiter = RunLimiter(self.cgroups, limits, uid=uid, workdir=wd)
            args, fds = bwrap_argv(bwrap=self.bwrap, layout=self.layout, workdir=wd,
                                   input_dir=staged, privileged=self.privileged,
                                   inner_uid=inner_uid)
            env = sandbox_env(limits.threads, self._path(), self._extra_env(env))
            status_r, status_w = os.pipe()
            exe = self.layout.inner_exe
            start = None
            if self.zygote is None:
                argv = limiter.argv_prefix() + args + launcher_argv(
                    exe, [exe, PROGRAM_NAME], status_fd=status_w, rlimits=limits.rlimits(),
                    uid=uid, nice=limits.nice)
            else:  # the program is forked from the zygote into this sandbox (zygote.py)
                handoff = Handoff()
                argv = (limiter.argv_prefix() + args + handoff.bwrap_args()
                        + handoff.holder_argv(exe, uid))
                fds = [*fds, *handoff.pass_fds()]
                request = {"cwd": SANDBOX_WORKDIR, "env": env, "cmd": [exe, PROGRAM_NAME],
                           "launch": launch_config(rlimits=limits.rlimits(), uid=uid,
                                                   nice=limits.nice)}
                start = functools.partial(
                    handoff.start, zygote=self.zygote, status_w=status_w, request=request,
                    join_files=limiter.cg.join_files() if limiter.cg is not None else [])
            raw = run_process(argv, cwd=None, env=env, timeout_s=limits.timeout_s,
                              output_bytes=limits.output_bytes, status_fd=(status_r, status_w),
                              pass_fds=tuple(fds), kill_tree=limiter.kill, monitor=limiter,
                              start=start)
            return finish(raw, wd=wd, backend=self.name, limits=limits, warnings=warnings,
                          weak=False, limiter=limiter)
        finally:
            if handoff is not None:  # its host ends, if the hand-over never ran
                handoff.close()
            if limiter is not None:
                limiter.close()
            if self.pool is not None:
                self.pool.release(uid, lock)
