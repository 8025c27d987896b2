"""The tiny program that starts the untrusted one inside the sandbox.

It runs with the sandbox's Python (`-I -S`, so nothing of the environment can change it):
drops to the unprivileged uid (when started as root), forks, sets the resource limits in the
child only (so the launcher itself can always report), execs the program, and writes one JSON
line to a status pipe: exit code or signal, the program's own wall-clock and its peak RSS.
"""

from __future__ import annotations

import json
from typing import Any

LAUNCHER_SOURCE = r"""
import json, os, resource, sys, time
cfg = json.loads(sys.argv[1]); cmd = sys.argv[2:]; sfd = cfg["status_fd"]
if cfg.get("uid") is not None:
    os.setgroups([]); os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    assert os.getuid() != 0 and os.geteuid() != 0
try:  # not dumpable: the program (same uid) cannot reach our status pipe via /proc/PID/fd
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE; exec resets it for the child
except Exception:
    pass
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.close(sfd)
        for name, value in cfg["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        os.execv(cmd[0], cmd)
    except BaseException as e:
        os.write(2, ("sandbox launcher: cannot start program: %r\n" % (e,)).encode())
    os._exit(127)
while True:
    try:
        _, st, ru = os.wait4(pid, 0)
        break
    except InterruptedError:
        continue
dt = time.monotonic() - t0
sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -sig
line = json.dumps({"exit_code": code, "duration_s": dt, "maxrss_kb": ru.ru_maxrss})
os.write(sfd, (line + "\n").encode())
os._exit(code if code >= 0 else 128 + sig)
"""


def launcher_argv(python: str, program: list[str], *, status_fd: int, rlimits: dict[str, int],
                  uid: int | None = None, gid: int | None = None) -> list[str]:
    """argv that runs `program` under the launcher with `python` (a path inside the sandbox)."""
    cfg: dict[str, Any] = {"status_fd": status_fd, "rlimits": rlimits, "uid": uid,
                           "gid": gid if gid is not None else uid}
    return [python, "-I", "-S", "-c", LAUNCHER_SOURCE, json.dumps(cfg), *program]


def parse_status(raw: bytes) -> dict[str, Any] | None:
    """The launcher's status line, or None if it never wrote one (killed, or tampered with)."""
    try:
        d = json.loads(raw.decode().strip().splitlines()[0])
        return {"exit_code": int(d["exit_code"]), "duration_s": float(d["duration_s"]),
                "maxrss_kb": int(d["maxrss_kb"])}
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None
