"""A pre-imported interpreter that forks each run's program into that run's bwrap sandbox.

A fresh program spends most of its CPU importing (bench_program_imports.py: 2.6 of 3.4 CPU-s
per program, pandas and scikit-learn; 0.29 CPU-s when forked from an interpreter that already
ran the imports). `Sandbox(backend="bwrap", preimport=("pandas", "sklearn.ensemble", ...))`
keeps one such interpreter (the zygote) per backend and leaves everything else as it was:

  * Each run still gets its own bwrap sandbox, built by the same `bwrap_argv` (mounts, /tmp,
    /proc, /dev, network, ipc, uts, pid and cgroup namespaces, seccomp, the run's cgroup). Its
    command is a holder that drops to the run's uid, says it is ready, and waits.
  * The host opens that sandbox's namespaces (/proc/<pid>/ns/*), the write ends of its output
    pipes, the run's status pipe and cgroup files, and sends them to the zygote (SCM_RIGHTS).
  * The zygote forks; the child joins the run's cgroups, enters the namespaces (the mount
    namespace last: from then on it sees only the run's view), installs the same seccomp filter
    (no_new_privs first), and runs the launcher's own `launch` (launcher.py): drop to the run's
    uid, fork the program, wait, write the status line. The program's process replaces the
    zygote's `__main__`, environment, argv and stdio with the run's and runs the witness
    bootstrap and main.py in place of exec.
  * The holder exits when the child closes its end of the hold pipe, which ends bwrap, which the
    host's run_process waits for as before; timeouts and kills work on the uid, the cgroup and
    bwrap's pid namespace exactly as for a fresh run.

The zygote itself runs in a bwrap sandbox with the same static mounts (so modules have the same
paths as in every run: tracebacks, the witness's library prefixes), no network, a read-only
root, in the host's pid namespace (a child may only enter pid namespaces below its own) and as
root with CAP_SYS_ADMIN, CAP_SYS_CHROOT, CAP_SETUID and CAP_SETGID, which it needs to enter the
runs' namespaces and which each child drops (setresuid to the run's uid) before the program
starts. It runs no untrusted code and reads nothing but requests from the host's socket; it exits
when the host closes it. Only privileged bwrap (root) is supported: as a normal user the runs
live in user namespaces that a sibling cannot enter.

What differs from a fresh interpreter, by design: the preloaded modules are not re-executed, so
their import-time state (BLAS threads: pinned to 1, as the zygote must not fork with threads;
numpy's global RandomState: reseeded in each program) is shared; `importlib.import_module` of a
preloaded module raises no witness evidence (plain `import` statements do).
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

from rl4mle_jax.env.sandbox.launcher import LAUNCH_DEFS

log = logging.getLogger(__name__)

NAMESPACES = ("net", "ipc", "uts", "cgroup", "pid", "mnt")  # mnt last: it changes the root
START_TIMEOUT_S = 180.0  # the zygote's imports (a cold page cache on a slow disk)
HANDOFF_TIMEOUT_S = 60.0  # bwrap's set-up of one run
_MSG_MAX = 1 << 20

# The sandboxed command of a run: drop to the run's uid, say "ready", wait for the hold pipe's
# EOF (the zygote's child writes the launcher's exit code there when the program has ended) and
# exit with that code, as bwrap's launcher would; 127 if nobody started the program.
HOLDER_SOURCE = r"""
import os, sys
uid, ready, hold = (int(a) for a in sys.argv[1:4])
if uid >= 0:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
os.write(ready, b"1")
os.close(ready)
said = b""
while len(said) < 16:
    b = os.read(hold, 16)
    if not b:
        break
    said += b
os._exit(int(said) if said.isdigit() and int(said) < 256 else 127)
"""

ZYGOTE_MAIN = r"""
import atexit, builtins, ctypes, gc, importlib, json, os, signal, socket, sys, threading, types
_cfg = json.loads(sys.argv[1])
del sys.argv[1:]
_sock = socket.socket(fileno=_cfg["sock_fd"])
_path0 = list(sys.path)
_loaded, _failed = [], []
for _name in _cfg["modules"]:
    try:
        importlib.import_module(_name)
        _loaded.append(_name)
    except BaseException as e:
        _failed.append("%s: %s: %s" % (_name, type(e).__name__, str(e)[:300]))
_libc = ctypes.CDLL(None, use_errno=True)
_filter = bytes.fromhex(_cfg["seccomp"]) if _cfg.get("seccomp") else None


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _seccomp():
    _check(_libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), "PR_SET_NO_NEW_PRIVS")
    if _filter is not None:
        buf = ctypes.create_string_buffer(_filter, len(_filter))
        prog = _Fprog(len(_filter) // 8, ctypes.addressof(buf))
        _check(_libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(prog), ctypes.c_ulong(0),
                           ctypes.c_ulong(0)), "PR_SET_SECCOMP")


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except BaseException:
        pass
    return 1


def _run_program(cmd, env):
    # The launcher's `start`: this process becomes the program (in place of exec).
    keep = sorted({0, 1, 2} | ({int(cmd[3]), int(cmd[4])} if cmd[1] == "-c" else set()))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    if null not in keep:
        os.close(null)
    lo = 3
    for fd in keep[3:] + [1 << 20]:
        if fd > lo:
            os.closerange(lo, fd)
        lo = fd + 1
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = _path0
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()  # its global state is the zygote's otherwise, the same in every run
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        if cmd[1] == "-c":
            sys.argv = ["-c"] + cmd[3:]
            main.__dict__["_preloaded"] = True
            exec(compile(cmd[2], "<string>", "exec"), main.__dict__)
        else:
            import runpy
            sys.argv = cmd[1:]
            runpy.run_path(cmd[1], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # What the interpreter does at exit: wait for threads, atexit, then the program's objects
    # (an unclosed file flushes when its last reference goes).
    for step in (threading._shutdown, atexit._run_exitfuncs, main.__dict__.clear, gc.collect,
                 sys.stdout.flush, sys.stderr.flush):
        try:
            step()
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:
            pass
    os._exit(code)


def _child(req, fds):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(_sock.detach())
    fd = dict(zip(req["fds"], fds))
    os.dup2(fd.pop("out"), 1)
    os.dup2(fd.pop("err"), 2)
    for name in [n for n in fd if n.startswith("cgroup:")]:
        f = fd.pop(name)
        os.write(f, b"0")  # v1 `tasks` or v2 `cgroup.procs`: this process, before it forks
        os.close(f)
    for ns in req["namespaces"]:
        f = fd.pop(ns)
        _check(_libc.setns(f, 0), "setns(%s)" % ns)
        os.close(f)
    os.chdir(req["cwd"])
    _seccomp()
    cfg = dict(req["launch"], status_fd=fd.pop("status"))
    env = req["env"]
    code = launch(cfg, req["cmd"], lambda cmd: _run_program(cmd, env))
    os.write(fd.pop("hold"), str(code).encode())  # the holder exits with it
    os._exit(code)


gc.collect()
gc.freeze()
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
# fork() copies only the calling thread: a module that started threads (native ones included)
# would leave its locks held in every child, so the host refuses such a zygote.
_threads = len(os.listdir("/proc/self/task"))
_sock.send(json.dumps({"pid": os.getpid(), "loaded": _loaded, "failed": _failed,
                       "threads": _threads}).encode())
_null = os.open("/dev/null", os.O_WRONLY)
os.dup2(_null, 1)
os.dup2(_null, 2)
os.close(_null)
while True:
    try:
        _msg, _fds, _, _ = socket.recv_fds(_sock, __MSG_MAX__, 64)
    except InterruptedError:
        continue
    if not _msg:
        break
    try:
        _req = json.loads(_msg)
        _pid = os.fork()
    except BaseException as e:
        for _f in _fds:
            os.close(_f)
        _sock.send(json.dumps({"error": repr(e)}).encode())
        continue
    if _pid == 0:
        try:
            _child(_req, _fds)
        except BaseException as e:
            try:
                os.write(2, ("sandbox zygote: cannot start the program: %r\n" % (e,)).encode())
            except BaseException:
                pass
        os._exit(127)
    for _f in _fds:
        os.close(_f)
    _sock.send(json.dumps({"pid": _pid}).encode())
""".replace("__MSG_MAX__", str(_MSG_MAX))
ZYGOTE_SOURCE = LAUNCH_DEFS + ZYGOTE_MAIN


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """The host's end: starts the zygote on first use (again if it died), hands it runs."""

    def __init__(self, argv_fn, modules: tuple[str, ...], env: dict[str, str],
                 seccomp: bytes | None):
        self._argv_fn = argv_fn  # () -> (bwrap argv up to the command, fds it references)
        self.modules = tuple(modules)
        self.env = env
        self.seccomp = seccomp
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None  # bwrap, whose child is the zygote
        self._pidfd = -1  # the zygote itself
        self.loaded: list[str] = []
        self.failed: list[str] = []
        self.starts = 0

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args, fds = self._argv_fn()
        cfg = {"sock_fd": child.fileno(), "modules": list(self.modules),
               "seccomp": self.seccomp.hex() if self.seccomp else None}
        with tempfile.TemporaryFile() as err:  # what bwrap or the imports said, if it fails
            try:
                self._proc = subprocess.Popen(
                    [*args, "-c", ZYGOTE_SOURCE, json.dumps(cfg)], stdin=subprocess.DEVNULL,
                    stdout=err, stderr=err, env=self.env, pass_fds=(child.fileno(), *fds),
                    start_new_session=True)
            finally:
                child.close()
                for fd in fds:
                    os.close(fd)
            parent.settimeout(START_TIMEOUT_S)
            try:
                hello = parent.recv(_MSG_MAX)
            except OSError as e:
                hello = b""
                log.warning("sandbox zygote: no answer (%s)", e)
            info = json.loads(hello) if hello else {}
            if info:
                self._pidfd = os.pidfd_open(int(info["pid"]))
            if not info or info["threads"] != 1:
                self._sock = parent
                self._stop()
                err.seek(0)
                said = err.read()[-2000:].decode(errors="replace")
                why = (f"it runs {info['threads']} threads after its imports (fork copies one: "
                       "leave out the modules that start threads)" if info else said)
                raise ZygoteError(f"the pre-imported interpreter did not start: {why}")
        self.loaded, self.failed = info["loaded"], info["failed"]
        for f in self.failed:
            log.warning("sandbox zygote: not preloaded: %s", f)
        parent.settimeout(HANDOFF_TIMEOUT_S)
        self._sock = parent
        self.starts += 1

    def spawn(self, names: list[str], fds: list[int], request: dict[str, Any]) -> int:
        """Forks a child for one run; returns its pid. `fds` are sent (the caller closes its
        own copies)."""
        msg = json.dumps({**request, "fds": names}).encode()
        if len(msg) > _MSG_MAX:
            raise ZygoteError(f"run request of {len(msg)} bytes (at most {_MSG_MAX})")
        with self._lock:
            for attempt in (0, 1):
                if self._sock is None:
                    self._start()
                try:
                    socket.send_fds(self._sock, [msg], fds)
                    reply = self._sock.recv(_MSG_MAX)
                    if not reply:
                        raise ConnectionError("the zygote closed its socket")
                    break
                except OSError as e:
                    self._stop()
                    if attempt:
                        raise ZygoteError(f"the pre-imported interpreter failed: {e}") from e
                    log.warning("sandbox zygote died (%s); starting a new one", e)
        out = json.loads(reply)
        if "error" in out:
            raise ZygoteError(f"the pre-imported interpreter could not fork: {out['error']}")
        return int(out["pid"])

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote exits when it reads the end of its socket
            self._sock = None
        if self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(self._pidfd)
            self._pidfd = -1
        if self._proc is not None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


def _wait_readable(fd: int, deadline: float) -> bool:
    left = deadline - time.monotonic()
    return left > 0 and bool(select.select([fd], [], [], left)[0])


def _read_all(fd: int, deadline: float, limit: int = 4096) -> bytes:
    data = b""
    while len(data) < limit and _wait_readable(fd, deadline):
        chunk = os.read(fd, limit - len(data))
        if not chunk:
            break
        data += chunk
        try:
            json.loads(data)
            break
        except ValueError:
            continue
    return data


def _same_ns(fd: int, ns: str) -> bool:
    st = os.fstat(fd)
    own = os.stat(f"/proc/self/ns/{ns}")
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class Handoff:
    """One run's pipes between bwrap (holder), the host and the zygote.

        h = Handoff(); argv = bwrap_args + h.bwrap_args() + h.holder_argv(python, uid)
        run_process(..., pass_fds=h.pass_fds(), start=lambda pid: h.start(pid, ...))
    """

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.ready_r, self.ready_w = os.pipe()
        self.hold_r, self.hold_w = os.pipe()

    def bwrap_args(self) -> list[str]:
        return ["--info-fd", str(self.info_w)]

    def holder_argv(self, python: str, uid: int | None) -> list[str]:
        return [python, "-I", "-S", "-c", HOLDER_SOURCE,
                str(-1 if uid is None else uid), str(self.ready_w), str(self.hold_r)]

    def pass_fds(self) -> tuple[int, ...]:
        return (self.info_w, self.ready_w, self.hold_r)  # run_process closes them

    def start(self, bwrap_pid: int, zygote: Zygote, *, status_w: int, join_files: list,
              request: dict[str, Any]) -> str | None:
        """After Popen(bwrap): hands the run to the zygote. Returns an error text or None."""
        deadline = time.monotonic() + HANDOFF_TIMEOUT_S
        fds: list[int] = []
        names: list[str] = []
        pidfd = -1
        try:
            raw = _read_all(self.info_r, deadline)
            try:
                child = int(json.loads(raw)["child-pid"])
            except (ValueError, KeyError, TypeError):
                return f"bwrap reported no sandbox ({raw[:200]!r})"
            pidfd = os.pidfd_open(child)
            if not _wait_readable(self.ready_r, deadline) or os.read(self.ready_r, 1) != b"1":
                return "the sandbox's holder never became ready"
            for ns in NAMESPACES:
                fds.append(os.open(f"/proc/{child}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC))
                names.append(ns)
            # Still alive after the opens: the pid was not reused, these are its namespaces.
            if select.select([pidfd], [], [], 0)[0]:
                return "the sandbox ended while it was being entered"
            if any(_same_ns(fd, ns) for fd, ns in zip(fds, names) if ns in ("mnt", "pid")):
                return "the sandbox's namespaces are the host's"
            for i, stream in enumerate(("out", "err")):
                fds.append(os.open(f"/proc/{bwrap_pid}/fd/{i + 1}", os.O_WRONLY | os.O_CLOEXEC))
                names.append(stream)
            for i, f in enumerate(join_files):
                fds.append(os.open(f, os.O_WRONLY | os.O_CLOEXEC))
                names.append(f"cgroup:{i}")
            fds += [status_w, self.hold_w]
            names += ["status", "hold"]
            zygote.spawn(names, fds, {**request, "namespaces": list(NAMESPACES)})
            return None
        except (OSError, ZygoteError) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            for fd in fds:
                if fd not in (status_w, self.hold_w):
                    os.close(fd)
            if pidfd >= 0:
                os.close(pidfd)
            self.close()

    def close(self) -> None:
        for name in ("info_r", "ready_r", "hold_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)
