"""bwrap with `preimport`: programs forked from a pre-imported interpreter (sandbox/zygote.py).

The same reward record as a fresh bwrap run for honest and hostile programs (links to the
answers and host files, forged milestones, fork bombs, memory hogs, the network); nothing of one
run reaches the next (patched libraries, files, random state); the zygote stays out of the
program's reach (processes, descriptors); the interpreter's exit is kept (exit codes, atexit,
threads, unflushed files); a dead zygote is replaced; and the CPU the imports took is gone.
The sandbox's own hostile and limit tests run against it too (test_sandbox.py's "zygote"
backend, test_sandbox_limits.py's "zygote" cases).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.sandbox import Sandbox, parse_preimport
from tests.env.backend_parity import (
    HOSTILE,
    HOSTILE_MORE,
    assert_hostile_record_as_reference,
    record,
    task_for_tests,
)
from tests.env.test_execute import HONEST

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.geteuid() == 0
         and (shutil.which("bwrap") or os.path.exists("/usr/bin/bwrap"))),
    reason="the zygote needs bwrap and root")

PRE = ("pandas", "sklearn.linear_model", "sklearn.ensemble")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return task_for_tests(tmp_path_factory)


@pytest.fixture(scope="module")
def sandboxes():
    root = Path(tempfile.gettempdir()) / f"rl4mle_zygote_tests_{uuid.uuid4().hex[:8]}"
    kw = dict(timeout_s=60, memory_mb=4096, max_procs=64, work_root=root)
    forked, fresh = Sandbox("bwrap", preimport=PRE, **kw), Sandbox("bwrap", **kw)
    yield forked, fresh
    forked.close()
    fresh.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def plain_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("plain")
    (d / "train.csv").write_text("id,x\n1,2\n")
    d.chmod(0o755)
    (d / "train.csv").chmod(0o644)
    return d


def test_honest_program_same_record_and_far_less_cpu(task, sandboxes):
    forked, fresh = sandboxes
    want = run_and_grade(HONEST, task, fresh)
    got = [run_and_grade(HONEST, task, forked) for _ in range(2)]
    for run in got:
        assert run.reward.status == "valid", run.reward.to_json()
        assert record(run) == record(want)
    # the imports (pandas, scikit-learn: ~2 CPU-s) are not paid again
    assert got[1].exec["cpu_s"] < 0.5 * want.exec["cpu_s"], (got[1].exec, want.exec)
    assert forked._backend.zygote.loaded == list(PRE) and forked._backend.zygote.starts == 1


@pytest.mark.parametrize("name", HOSTILE + HOSTILE_MORE)
def test_hostile_programs_get_the_fresh_runs_record(task, sandboxes, tmp_path, name):
    forked, fresh = sandboxes
    assert_hostile_record_as_reference(name, task, tmp_path, forked, fresh)


# A program that tampers with everything it shares with the zygote and later runs.
TAMPER = """
import json, os, signal, sys
import numpy as np
import sklearn.linear_model as lm
out = {"rand": float(np.random.rand()), "patched_before": hasattr(lm, "_tampered")}
lm._tampered = True
lm.LogisticRegression.fit = lambda self, *a, **k: "forged"
np.random.seed(0)
open("/tmp/left_by_a_run", "w").write("x")
out["tmp_before"] = sorted(os.listdir("/tmp"))
fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
out["fds"] = fds
pids = []
for pid in range(1, 4096):
    try:
        os.kill(pid, 0)
        pids.append(pid)
    except PermissionError:
        pids.append(pid)
    except ProcessLookupError:
        pass
out["pids"] = pids
out["uid"] = os.getuid()
import ctypes
r = ctypes.CDLL(None, use_errno=True).unshare(0x00020000)  # CLONE_NEWNS
out["unshare"] = [r, ctypes.get_errno()]
print(json.dumps(out))
"""


def test_nothing_of_one_run_reaches_the_next_or_the_zygote(sandboxes, plain_input):
    forked, _ = sandboxes
    reps = []
    for _ in range(3):
        res = forked.run(TAMPER, plain_input)
        assert res.status == "ok", res.stderr[-2000:]
        reps.append(json.loads(res.stdout.strip().splitlines()[-1]))
        res.cleanup()
    for rep in reps:
        assert rep["patched_before"] is False  # a library patched by an earlier run: not here
        assert rep["tmp_before"] == ["left_by_a_run"]  # its own /tmp only
        assert rep["uid"] != 0 and rep["unshare"] == [-1, 1]  # EPERM: the seccomp filter
        # the program's processes only: bwrap's pid 1, the holder, itself; nothing of the host
        assert max(rep["pids"]) < 10 and len(rep["pids"]) <= 3, rep["pids"]
        # no descriptor of the zygote (its socket, the namespaces, the status pipe): the
        # witness's evidence pipe at most
        assert len(rep["fds"]) <= 1, rep["fds"]
    assert len({r["rand"] for r in reps}) == 3  # numpy's global state reseeded per program
    # SIGKILL to every pid it can name: its own sandbox ends, the zygote lives on
    res = forked.run("import os\nfor p in range(1, 1 << 16):\n    try:\n"
                     "        os.kill(p, 9)\n    except OSError:\n        pass\n", plain_input)
    res.cleanup()
    assert forked._backend.zygote.starts == 1 and forked._backend.zygote._proc.poll() is None
    res = forked.run("import sklearn.linear_model as lm\n"
                     "print(lm.LogisticRegression().fit([[0], [1]], [0, 1]).coef_.shape)\n",
                     plain_input)
    assert res.stdout.strip() == "(1, 1)", res.stderr[-2000:]


EXITS = {
    "import sys\nsys.exit(3)": (3, ""),
    "raise SystemExit('bye')": (1, "bye"),
    "raise ValueError('boom')": (1, "ValueError: boom"),
    "import os\nos._exit(5)": (5, ""),
}


@pytest.mark.parametrize("code", list(EXITS))
def test_exit_codes_are_the_interpreters(sandboxes, plain_input, code):
    forked, fresh = sandboxes
    want_code, want_err = EXITS[code]
    for sb in (forked, fresh):
        res = sb.run(code, plain_input)
        assert res.exit_code == want_code, (sb, res.stderr[-1000:])
        assert want_err in res.stderr
        res.cleanup()


AT_EXIT = """
import atexit, threading, time
f = open("submission/unclosed.txt", "w")
f.write("kept")
atexit.register(lambda: open("submission/atexit.txt", "w").write("ran"))
def late():
    time.sleep(0.3)
    open("submission/thread.txt", "w").write("waited")
threading.Thread(target=late).start()
print("main done")
"""


def test_exit_runs_atexit_waits_for_threads_and_flushes_files(sandboxes, plain_input):
    forked, _ = sandboxes
    res = forked.run(AT_EXIT, plain_input)
    assert res.status == "ok" and res.stdout.strip() == "main done", res.stderr[-1000:]
    sub = res.workdir / "submission"
    assert [(sub / n).read_text() for n in ("unclosed.txt", "atexit.txt", "thread.txt")] == [
        "kept", "ran", "waited"]
    res.cleanup()


def test_witness_sees_the_preloaded_imports(sandboxes, plain_input):
    forked, fresh = sandboxes
    code = ("import pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n"
            "LogisticRegression().fit([[0], [1]], [0, 1])\n")
    got, want = forked.run(code, plain_input), fresh.run(code, plain_input)
    assert got.evidence["verified"] and got.evidence["milestones"] == want.evidence["milestones"]
    assert {"pandas", "sklearn"} <= set(got.evidence["libraries"])
    assert "libraries_imported" in got.evidence["milestones"]
    got.cleanup()
    want.cleanup()


def test_a_dead_zygote_is_replaced_and_timeouts_still_end_runs(plain_input, tmp_path):
    sb = Sandbox("bwrap", preimport=("json",), timeout_s=2, work_root=tmp_path / "runs")
    try:
        assert sb.run("print(1)", plain_input).stdout.strip() == "1"
        z = sb._backend.zygote
        signal.pidfd_send_signal(z._pidfd, signal.SIGKILL)
        z._proc.wait()  # bwrap ends with it
        res = sb.run("print(2)", plain_input)
        assert res.stdout.strip() == "2" and z.starts == 2, res.stderr[-1000:]
        t = time.monotonic()
        res = sb.run("while True:\n    pass\n", plain_input)
        assert res.status == "timeout" and time.monotonic() - t < 10
    finally:
        sb.close()


def test_a_module_that_fails_to_import_is_named_and_runs_go_on(plain_input, tmp_path):
    sb = Sandbox("bwrap", preimport=("json", "no_such_module_here"), work_root=tmp_path / "r")
    try:
        res = sb.run("import json\nprint(json.dumps([1]))", plain_input)
        assert res.stdout.strip() == "[1]", res.stderr[-1000:]
        z = sb._backend.zygote
        assert z.loaded == ["json"] and "no_such_module_here" in z.failed[0]
    finally:
        sb.close()


def test_preimport_is_checked():
    assert parse_preimport(" pandas, sklearn.ensemble ,") == ("pandas", "sklearn.ensemble")
    with pytest.raises(ValueError, match="not module names"):
        parse_preimport("os; rm -rf /")
    with pytest.raises(ValueError, match="not module names"):
        Sandbox("bwrap", preimport="numpy,os.path/..")


def test_other_backends_start_programs_fresh_and_say_so(caplog):
    with caplog.at_level("WARNING"):
        sb = Sandbox("subprocess", preimport=("numpy",))
    assert "preimport is a feature of the bwrap backend" in caplog.text
    sb.close()


def test_without_root_programs_start_fresh_and_say_so(monkeypatch, plain_input, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the backend's view: not privileged
    sb = Sandbox("bwrap", preimport=("numpy",), work_root=tmp_path)
    assert sb._backend.zygote is None and "zygote" not in repr(sb)
    monkeypatch.undo()
    res = sb.run("print(1)", plain_input)  # bwrap's unprivileged mode (a user namespace)
    assert res.stdout.strip() == "1" and any("preimport ignored" in w for w in res.warnings)
    sb.close()


def test_a_zygote_that_runs_threads_is_refused_with_the_reason(monkeypatch, plain_input,
                                                               tmp_path):
    from rl4mle_jax.env.sandbox import zygote

    # as a preloaded module that starts a thread at import would
    threaded = ("import threading, time\n"
                "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    monkeypatch.setattr(zygote, "ZYGOTE_SOURCE", threaded + zygote.ZYGOTE_SOURCE)
    sb = Sandbox("bwrap", preimport=("json",), work_root=tmp_path)
    with pytest.raises(RuntimeError, match="runs 2 threads after its imports"):
        sb.run("print(1)", plain_input)
    sb.close()


# Looks for the witness key in every frame below its own (a forked program's stack holds the
# launcher's and the zygote's frames) and signs a trained model with each 32-byte candidate.
KEY_HUNTER = """
import hashlib, hmac, json, os, stat, sys
cands, f = [], sys._getframe()
while f is not None:
    for scope in (f.f_locals, f.f_globals):
        for v in list(scope.values()):
            vals = list(v.values()) if isinstance(v, dict) else [v]
            cands += [x for x in vals if isinstance(x, (bytes, bytearray)) and len(x) == 32]
    f = f.f_back
fds = []
for fd in range(3, 1024):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fds.append(fd)
    except OSError:
        pass
for key in cands:
    for seq, (kind, detail) in enumerate([("m", "model_trained"), ("f", "forged.fit")], 1):
        body = ("%d 99999 %s %s" % (seq, kind, detail)).encode()
        line = body + b" " + hmac.new(bytes(key), body, "sha256").hexdigest().encode() + b"\\n"
        for fd in fds:
            try:
                os.write(fd, line)
            except OSError:
                pass
print(json.dumps({"candidates": len(cands), "fds": fds}))
"""


@pytest.mark.parametrize("which", ["forked", "fresh"])
def test_the_witness_key_is_not_in_the_programs_memory(sandboxes, plain_input, which):
    sb = dict(zip(("forked", "fresh"), sandboxes))[which]
    res = sb.run(KEY_HUNTER, plain_input)
    assert res.status == "ok", res.stderr[-2000:]
    assert "model_trained" not in res.evidence["milestones"], (res.stdout, res.evidence)
    assert "forged.fit" not in res.evidence["fits"]
    res.cleanup()


def test_a_sandbox_that_fails_to_start_ends_the_run_at_once(monkeypatch, plain_input, tmp_path):
    from rl4mle_jax.env.sandbox import bwrap

    sb = Sandbox("bwrap", preimport=("json",), work_root=tmp_path)
    assert sb.run("print(1)", plain_input).stdout.strip() == "1"  # checked, zygote started
    real = bwrap.bwrap_argv

    def broken(**kw):
        args, fds = real(**kw)
        return args + ["--no-such-bwrap-option"], fds

    monkeypatch.setattr(bwrap, "bwrap_argv", broken)
    t = time.monotonic()
    res = sb.run("print(1)", plain_input)
    assert res.status == "error" and res.exit_code != 0, res
    assert "bwrap reported no sandbox" in res.stderr and "no-such-bwrap-option" in res.stderr
    assert time.monotonic() - t < 10  # not the hand-over's 60 s timeout
    sb.close()
