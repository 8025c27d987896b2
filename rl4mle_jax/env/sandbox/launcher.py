"""The tiny program that starts the untrusted one inside the sandbox.

It runs with the sandbox's Python (`-I -S`, so nothing of the environment can change it):
drops to the unprivileged uid (when started as root), forks, sets the resource limits in the
child only (so the launcher itself can always report), execs the program, and writes one JSON
line to a status pipe: exit code or signal, the program's own wall-clock, its CPU time (user +
system, its own and its reaped children's) and its peak RSS.

With `witness` (the default) the program is started under the witness bootstrap (witness.py):
the launcher makes a fresh key (after the fork: the program's memory never holds a copy),
hands it over through a pipe read once by the bootstrap, keeps the read end of the evidence
pipe, verifies every line after the program exits and adds the summary to the status line as
"evidence".

The same `launch` runs in zygote.py's children, whose `start` runs the program in the forked,
pre-imported interpreter instead of exec.
"""

from __future__ import annotations

import json
from typing import Any

from rl4mle_jax.env.sandbox.witness import BOOTSTRAP, READER, validate_evidence

_STATUS_MAX = 4000  # bytes; the host keeps the first 4096 of the status pipe

# launch(cfg, cmd, start): the launcher's work; `start(cmd)` replaces the forked child with the
# program and never returns (os.execv here; zygote.py runs it in the pre-imported interpreter).
LAUNCH_DEFS = r"""
def launch(cfg, cmd, start):
    import json, os, resource, time
    sfd = cfg["status_fd"]
    witness = cfg.get("witness")
    if cfg.get("uid") is not None:
        os.setgroups([]); os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        assert os.getuid() != 0 and os.geteuid() != 0
    try:  # not dumpable: the program (same uid) cannot reach our status pipe via /proc/PID/fd
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE; exec resets it for the child
    except Exception:
        pass
    if witness:
        kr, kw = os.pipe()
        er, ew = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(sfd)
            if witness:
                os.close(er)
                os.close(kw)
                n = 300 + int.from_bytes(os.urandom(2), "little") % 400
                k2, e2 = n, n + 1 + int.from_bytes(os.urandom(1), "little")
                os.dup2(kr, k2)
                os.dup2(ew, e2)
                os.close(kr)
                os.close(ew)
                cmd = [cmd[0], "-c", cfg["bootstrap"], str(k2), str(e2)] + cmd[1:]
            if cfg.get("nice"):
                os.nice(cfg["nice"])
            for name, value in cfg["rlimits"].items():
                resource.setrlimit(getattr(resource, name), (value, value))
            start(cmd)
        except BaseException as e:
            os.write(2, ("sandbox launcher: cannot start program: %r\n" % (e,)).encode())
        os._exit(127)
    if witness:
        # Made after the fork, so that no copy of it is in the program's memory (zygote.py's
        # programs are forks that never exec); the bootstrap's first read waits for it.
        key = os.urandom(32)
        os.write(kw, key)
        os.close(kw)
    while True:
        try:
            _, st, ru = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    dt = time.monotonic() - t0
    sig = os.WTERMSIG(st) if os.WIFSIGNALED(st) else None
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -sig
    status = {"exit_code": code, "duration_s": dt, "maxrss_kb": ru.ru_maxrss,
              "cpu_s": ru.ru_utime + ru.ru_stime}
    if witness:
        os.close(kr)
        os.close(ew)
        try:
            status["evidence"] = read_evidence(er, key)
        except Exception as e:
            status["evidence"] = {"witness": 1, "verified": False, "forged_lines": 0,
                                  "milestones": [], "libraries": [], "fits": [], "input_reads": [],
                                  "refused": [], "error": "reader: %r" % (e,)}
    line = json.dumps(status)
    while len(line) > STATUS_MAX and witness:
        ev = status["evidence"]
        longest = max(("fits", "input_reads", "refused", "libraries"), key=lambda k: len(ev[k]))
        if not ev[longest]:
            break
        ev[longest].pop()
        line = json.dumps(status)
    os.write(sfd, (line + "\n").encode())
    return code if code >= 0 else 128 + sig
"""
LAUNCH_DEFS = READER + f"\nSTATUS_MAX = {_STATUS_MAX}\n" + LAUNCH_DEFS
LAUNCHER_SOURCE = LAUNCH_DEFS + r"""
import json, os, sys
os._exit(launch(json.loads(sys.argv[1]), sys.argv[2:], lambda cmd: os.execv(cmd[0], cmd)))
"""


def launcher_argv(python: str, program: list[str], *, status_fd: int, rlimits: dict[str, int],
                  uid: int | None = None, gid: int | None = None,
                  witness: bool = True, nice: int = 0) -> list[str]:
    """argv that runs `program` under the launcher with `python` (a path inside the sandbox).

    witness: start `program` ([python, script, *args]) under the witness bootstrap.
    nice: added to the program's niceness (the launcher itself keeps the caller's).
    """
    cfg = {"status_fd": status_fd, **launch_config(rlimits=rlimits, uid=uid, gid=gid,
                                                    witness=witness, nice=nice)}
    return [python, "-I", "-S", "-c", LAUNCHER_SOURCE, json.dumps(cfg), *program]


def launch_config(*, rlimits: dict[str, int], uid: int | None = None, gid: int | None = None,
                  witness: bool = True, nice: int = 0) -> dict[str, Any]:
    """`launch`'s settings, less the status pipe."""
    cfg: dict[str, Any] = {"rlimits": rlimits, "uid": uid, "gid": gid if gid is not None else uid,
                           "witness": bool(witness), "nice": int(nice)}
    if witness:
        cfg["bootstrap"] = BOOTSTRAP
    return cfg


def parse_status(raw: bytes) -> dict[str, Any] | None:
    """The launcher's status line, or None if it never wrote one (killed, or tampered with)."""
    try:
        d = json.loads(raw.decode().strip().splitlines()[0])
        out = {"exit_code": int(d["exit_code"]), "duration_s": float(d["duration_s"]),
               "maxrss_kb": int(d["maxrss_kb"])}
        if d.get("cpu_s") is not None:
            out["cpu_s"] = max(float(d["cpu_s"]), 0.0)
        ev = validate_evidence(d.get("evidence"))
        if ev is not None:
            out["evidence"] = ev
        return out
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None
