"""Aggregate limits, socket families, cleanup and host-side inspection, with real bwrap runs.

Each hostile program reports what it managed as JSON on stdout; the tests check that report
and the host: no process, cgroup or mount of the run survives, cleanup is quick and complete.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl4mle_jax.env.sandbox import ExecResult, Sandbox
from rl4mle_jax.env.sandbox.cgroups import PREFIX, cpu_weight, detect
from rl4mle_jax.env.sandbox.runfs import remove_tree

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandboxes"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
]
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="cgroups and tmpfs need root here")


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("limits_task")
    pub = root / "public"
    pub.mkdir()
    (pub / "train.csv").write_text("id,x,y\n1,2,0\n")
    runs = Path(tempfile.gettempdir()) / f"rl4mle_sandbox_limits_{uuid.uuid4().hex[:8]}"
    yield {"root": root, "input": pub, "runs": runs}
    shutil.rmtree(runs, ignore_errors=True)


# Each limit also holds for programs forked from a pre-imported interpreter (sandbox/zygote.py).
PRE = [(), pytest.param(("numpy",), id="zygote", marks=needs_root)]


def _sb(task, **kw) -> Sandbox:
    kw.setdefault("timeout_s", 20)
    kw.setdefault("memory_mb", 1024)
    kw.setdefault("max_procs", 64)
    return Sandbox(backend="bwrap", work_root=task["runs"], **kw)


def _report(res: ExecResult) -> dict:
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON report; status={res.status} stderr={res.stderr[-2000:]}"
    return json.loads(lines[-1])


def _procs_with_token(token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


def _our_cgroups() -> list[str]:
    cg, _ = detect()
    if cg is None:
        return []
    return [str(b / e.name) for b in cg.bases for e in os.scandir(b)
            if e.name.startswith(PREFIX + cg.tag)]


def _assert_nothing_left(res: ExecResult, token: str | None = None) -> None:
    if token is not None:
        assert _procs_with_token(token) == []
    assert _our_cgroups() == []
    t = time.monotonic()
    assert res.cleanup() is True
    assert time.monotonic() - t < 3.0
    assert not os.path.lexists(res.workdir)
    assert str(res.workdir) not in Path("/proc/mounts").read_text()


# ----------------------------------------------------------------------------- memory, cpu

TREE_MEMORY = """
import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        x = b"\\x01" * (400 << 20)  # touched: 400 MB resident, under the per-process RLIMIT_AS
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
codes = [os.waitpid(p, 0)[1] for p in kids]
print("children", codes)
"""


@needs_root
@pytest.mark.parametrize("pre", PRE)
def test_tree_memory_limit_is_oom_and_peak_is_the_trees(task, pre):
    token = uuid.uuid4().hex
    res = _sb(task, preimport=pre, memory_mb=512).run(TREE_MEMORY, task["input"],
                                                      env={"TOK": token})
    assert res.status == "oom", (res.status, res.stdout, res.stderr[-500:])
    assert res.peak_memory_mb is not None and res.peak_memory_mb > 420, res.peak_memory_mb
    assert any("cgroup" in w for w in res.warnings), res.warnings
    assert res.duration_s < 5.0  # ended by the limit, not by the children finishing
    _assert_nothing_left(res, token)


CPU_HOG = """
import json, os, time
t0 = time.time()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.time() - t0 < 2.0:
            pass
        os._exit(0)
    kids.append(pid)
usage = 0.0
for p in kids:
    _, _, ru = os.wait4(p, 0)
    usage += ru.ru_utime + ru.ru_stime
print(json.dumps({"cores": usage / (time.time() - t0)}))
"""


@needs_root
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to show the cap")
@pytest.mark.parametrize("pre", PRE)
def test_cpus_caps_the_whole_tree(task, pre):
    res = _sb(task, preimport=pre, cpus=1).run(CPU_HOG, task["input"])
    assert res.status == "ok", res.stderr[-500:]
    cores = _report(res)["cores"]
    assert 0.3 < cores <= 1.2, cores
    _assert_nothing_left(res)


# ----------------------------------------------------------------------------- disk, inodes

FILL = """
import errno, json, os
out = {}
try:
    with open("submission/big.bin", "wb") as f:
        for i in range(64):
            f.write(b"0" * (1 << 20))
            f.flush()
    out["disk"] = "wrote 64 MB"
except OSError as e:
    out["disk"] = errno.errorcode[e.errno]
os.remove("submission/big.bin")
n = 0
try:
    while n < 5000:
        open(f"tmp/f{n}", "w").close()
        n += 1
    out["inodes"] = "made 5000"
except OSError as e:
    out["inodes"] = errno.errorcode[e.errno]
out["files"] = n
print(json.dumps(out))
"""


@needs_root
@pytest.mark.parametrize("pre", PRE)
def test_disk_bytes_and_inodes_of_the_run_dir_are_bounded(task, pre):
    res = _sb(task, preimport=pre, disk_mb=16, max_inodes=300).run(FILL, task["input"])
    assert res.status == "ok", res.stderr[-500:]
    rep = _report(res)
    assert rep["disk"] == "ENOSPC" and rep["inodes"] == "ENOSPC", rep
    assert rep["files"] < 300
    assert any("tmpfs" in w for w in res.warnings), res.warnings
    _assert_nothing_left(res)


FORK_BOMB = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print("forks", n, e.errno, flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


@pytest.mark.parametrize("pre", PRE)
def test_fork_bomb_is_contained_and_leaves_nothing(task, pre):
    token = uuid.uuid4().hex
    res = _sb(task, preimport=pre, max_procs=24, timeout_s=2).run(FORK_BOMB, task["input"],
                                                                  env={"TOK": token})
    assert res.status == "timeout"
    assert 0 < int(res.stdout.split()[1]) < 24, res.stdout
    time.sleep(0.2)
    _assert_nothing_left(res, token)


# ----------------------------------------------------------------------------- sockets

SOCKETS = """
import json, socket
out = {}
for name, family, kind in [("vsock", 40, socket.SOCK_STREAM), ("netlink", 16, socket.SOCK_RAW),
                           ("packet", 17, socket.SOCK_RAW), ("bluetooth", 31, socket.SOCK_STREAM),
                           ("alg", 38, socket.SOCK_SEQPACKET), ("inet", 2, socket.SOCK_STREAM),
                           ("inet6", 10, socket.SOCK_DGRAM)]:
    try:
        socket.socket(family, kind).close()
        out[name] = "created"
    except OSError as e:
        out[name] = e.errno
try:
    socket.socketpair(16, socket.SOCK_RAW)
    out["netlink_pair"] = "created"
except OSError as e:
    out["netlink_pair"] = e.errno
a, b = socket.socketpair()
a.send(b"hi")
out["unix_pair"] = b.recv(2).decode()
print(json.dumps(out))
"""


@pytest.mark.parametrize("pre", PRE)
def test_only_unix_and_inet_sockets_exist(task, pre):
    res = _sb(task, preimport=pre).run(SOCKETS, task["input"])
    assert res.status == "ok", res.stderr[-500:]
    rep = _report(res)
    for name in ("vsock", "netlink", "packet", "bluetooth", "alg", "netlink_pair"):
        assert rep[name] == 97, rep  # EAFNOSUPPORT
    assert rep["inet"] == rep["inet6"] == "created" and rep["unix_pair"] == "hi"
    res.cleanup()


# ----------------------------------------------------------------------------- cleanup

DEEP = """
import os
os.chdir("submission")
for _ in range(10000):
    os.mkdir("d")
    os.chdir("d")
open("leaf", "w").write("x")
os.chdir("/workdir/tmp")
for i in range(50):
    os.makedirs(f"locked/{i}/inner")
    open(f"locked/{i}/inner/f", "w").write("x")
    os.chmod(f"locked/{i}/inner/f", 0)
    os.chmod(f"locked/{i}/inner", 0)
    os.chmod(f"locked/{i}", 0)
os.chmod("locked", 0)
print("built")
"""


def test_deep_and_locked_trees_are_cleaned_up_quickly(task):
    res = _sb(task, timeout_s=60).run(DEEP, task["input"])
    assert res.status == "ok" and "built" in res.stdout, res.stderr[-500:]
    _assert_nothing_left(res)


def test_remove_tree_without_tmpfs_handles_depth_and_modes(tmp_path):
    top = tmp_path / "run"
    top.mkdir()
    build = ("import os\nos.chdir(os.environ['TOP'])\nfor _ in range(10000):\n"
             "    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').close()\nos.chmod('.', 0)\n")
    subprocess.run([sys.executable, "-c", build], env={"TOP": str(top)}, check=True)
    (top / "ro").mkdir()
    (top / "ro" / "f").write_text("x")
    os.chmod(top / "ro" / "f", 0)
    os.chmod(top / "ro", 0o500)
    (top / "link").symlink_to(tmp_path)  # never followed
    t = time.monotonic()
    assert remove_tree(top) is True
    assert time.monotonic() - t < 5.0 and not top.exists() and tmp_path.is_dir()
    assert remove_tree(top) is True  # already gone: still fine


@needs_root
def test_stale_cgroups_of_dead_hosts_are_swept():
    cg, _ = detect()
    assert cg is not None, "this machine allows cgroups as root"
    ns = cg.tag.split("-")[0]
    stale = [b / f"{PREFIX}{ns}-999999999-1-0" for b in cg.bases]  # a pid above pid_max
    for d in stale:
        d.mkdir()
    assert cg.sweep() >= len(stale)
    assert not any(d.exists() for d in stale)


def test_cpu_weight_follows_the_kernels_nice_levels():
    """Each nice level is ~10% of CPU against a nice-0 task: weights fall ~1.25x per level."""
    v1 = [cpu_weight(n, 1) for n in range(20)]
    assert v1[0] == 1024 and v1[10] == 110 and v1[19] == 15
    assert all(1.19 < a / b < 1.31 for a, b in zip(v1, v1[1:]))
    v2 = [cpu_weight(n, 2) for n in range(20)]
    assert v2[0] == 100 and v2[19] == 1 and v2 == sorted(v2, reverse=True)
    assert all(abs(b - a * 100 / 1024) <= 0.5 for a, b in zip(v1, v2))


@needs_root
def test_a_niced_runs_cgroup_weighs_like_a_niced_task():
    """Niceness counts only inside a cgroup: the run's cgroup itself gets the weight."""
    cg, _ = detect()
    assert cg is not None, "this machine allows cgroups as root"
    for nice in (0, 10):
        run = cg.create(64, 1.0, 16, nice=nice)
        try:
            files = [d / ("cpu.shares" if cg.version == 1 else "cpu.weight") for d in run.dirs]
            values = {int(f.read_text()) for f in files if f.exists()}
            assert values == {cpu_weight(nice, cg.version) if nice else
                              (1024 if cg.version == 1 else 100)}, (nice, values)
        finally:
            run.remove()


@needs_root
def test_join_prefix_puts_the_process_and_its_children_in_every_run_cgroup():
    """The join writes "0" (v1: to `tasks`, moving only the calling thread: no global lock, no
    RCU grace period per run); the exec'd program and what it forks must still sit in each."""
    cg, _ = detect()
    assert cg is not None, "this machine allows cgroups as root"
    run = cg.create(64, 1.0, 16)
    try:
        if cg.version == 1:
            assert all(f.name == "tasks" for f in run.join_files())
        script = "cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup'"
        out = subprocess.run([*run.argv_prefix(), "/bin/sh", "-c", script],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        name = run.dirs[0].name
        lines = out.stdout.splitlines()
        own = [ln for ln in lines if ln.rpartition(":")[2].endswith("/" + name)]
        # each process lists one line per hierarchy we joined (v2: the one unified line)
        assert len(own) == 2 * len(run.dirs), out.stdout
    finally:
        assert run.remove()


# ----------------------------------------------------------------------------- host inspection

LINKS = """
import os
if os.environ["MODE"] == "file":
    os.symlink("/etc/passwd", "submission/submission.csv")
else:
    os.makedirs("tmp/elsewhere")
    open("tmp/elsewhere/submission.csv", "w").write("id,y\\n1,0\\n")
    os.rmdir("submission")
    os.symlink("tmp/elsewhere", "submission")
"""


@pytest.mark.parametrize("mode", ["file", "dir"])
def test_symlinked_submission_does_not_exist(task, mode):
    res = _sb(task).run(LINKS, task["input"], env={"MODE": mode})
    assert res.status == "ok", res.stderr[-500:]
    assert os.path.islink(res.workdir / "submission" / "submission.csv") or mode == "dir"
    assert res.submission_exists is False
    _assert_nothing_left(res)


@pytest.mark.parametrize("pre", PRE)
def test_mountinfo_shows_no_task_path(task, pre):
    res = _sb(task, preimport=pre).run("print(open('/proc/self/mountinfo').read())", task["input"])
    assert res.status == "ok", res.stderr[-500:]
    assert "/workdir/input" in res.stdout
    assert str(task["root"]) not in res.stdout and str(task["input"]) not in res.stdout
    assert os.path.realpath(task["input"]) not in res.stdout
    res.cleanup()


def test_limits_are_validated_with_named_errors():
    for kw, msg in [(dict(disk_mb=0), "disk_mb must be None or an integer >= 1"),
                    (dict(max_inodes=10), "max_inodes must be None or an integer >= 64"),
                    (dict(memory_mb=1.5), "memory_mb must be None or an integer"),
                    (dict(cpus=0), "cpus must be positive")]:
        with pytest.raises(ValueError, match=msg):
            Sandbox(backend="bwrap", **kw)


def test_repr_names_the_mechanism(task):
    sb = _sb(task)
    want = "cgroup v" if IS_ROOT else "watchdog"
    assert want in repr(sb) and "disk_mb=1024" in repr(sb) and "max_inodes=16384" in repr(sb)
