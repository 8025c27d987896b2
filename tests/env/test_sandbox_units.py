"""Sandbox pieces without running programs: output capping, status classification, bad inputs,
and the docker backend (against a fake client; a real engine test skips when none answers)."""

from __future__ import annotations

import inspect
import os
import signal
from pathlib import Path

import pytest

from rl4mle_jax.env.sandbox import ExecResult, Sandbox
from rl4mle_jax.env.sandbox.common import (
    Limits,
    escaping_symlinks,
    input_warnings,
    prepare_workdir,
)
from rl4mle_jax.env.sandbox.launcher import parse_status
from rl4mle_jax.env.sandbox.result import OutputCapture, classify


def test_output_capture_keeps_everything_when_short():
    cap = OutputCapture(100)
    for piece in (b"hello ", b"world"):
        cap.feed(piece)
    assert cap.text() == "hello world" and not cap.truncated and cap.total == 11


def test_output_capture_keeps_head_and_tail_of_a_long_stream():
    cap = OutputCapture(20)
    data = bytes(range(256)) * 40  # 10240 bytes fed in uneven pieces
    for i in range(0, len(data), 37):
        cap.feed(data[i:i + 37])
    assert cap.total == len(data) and cap.truncated
    assert bytes(cap.head) == data[:10]
    assert bytes(cap.tail[-10:]) == data[-10:] and len(cap.tail) <= 20
    assert cap.raw_tail(5) == data[-5:]
    text = cap.text()
    assert f"{len(data) - 20:,} bytes of output cut" in text


def test_output_capture_exactly_at_the_cap_is_not_truncated():
    cap = OutputCapture(10)
    cap.feed(b"0123456789")
    assert not cap.truncated and cap.text() == "0123456789"


@pytest.mark.parametrize("kw,expected", [
    (dict(timed_out=True, exit_code=None), "timeout"),
    (dict(exit_code=0), "ok"),
    (dict(exit_code=1), "error"),
    (dict(exit_code=1, stderr_tail=b"Traceback...\nMemoryError\n"), "oom"),
    (dict(exit_code=1, stderr_tail=b"numpy._core._exceptions._ArrayMemoryError: Unable"), "oom"),
    (dict(exit_code=-signal.SIGKILL), "killed"),
    (dict(exit_code=-signal.SIGKILL, peak_memory_mb=980.0, memory_mb=1000), "oom"),
    (dict(exit_code=-signal.SIGABRT, stderr_tail=b"terminate called: std::bad_alloc"), "oom"),
    (dict(exit_code=-signal.SIGSEGV), "killed"),
])
def test_classify(kw, expected):
    args = dict(timed_out=False, exit_code=0, stderr_tail=b"", peak_memory_mb=None, memory_mb=None)
    assert classify(**{**args, **kw}) == expected


def test_exec_result_rejects_unknown_status(tmp_path):
    with pytest.raises(ValueError, match="status must be one of .* got 'crashed'"):
        ExecResult(status="crashed", exit_code=1, duration_s=0.0, stdout="", stderr="",
                   submission_path=tmp_path / "s.csv", submission_exists=False, workdir=tmp_path,
                   backend="bwrap")


def test_parse_status_rejects_garbage():
    line = b'{"exit_code": 3, "duration_s": 1.5, "maxrss_kb": 100}\n'
    assert parse_status(line)["exit_code"] == 3
    assert parse_status(b"") is None and parse_status(b"not json") is None
    assert parse_status(b'{"exit_code": "x"}') is None


def test_classify_aggregate_limit_hits():
    args = dict(timed_out=False, exit_code=0, stderr_tail=b"", peak_memory_mb=None, memory_mb=None)
    assert classify(**args, limit_hit="oom") == "oom"
    assert classify(**{**args, "timed_out": True}, limit_hit="oom") == "oom"
    assert classify(**{**args, "exit_code": -9}, limit_hit="disk") == "killed"


def test_seccomp_filter_refuses_foreign_socket_families():
    import struct

    from rl4mle_jax.env.sandbox.seccomp import build_filter

    prog = build_filter("x86_64")
    ins = [struct.unpack("<HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    assert (0x06, 0, 0, 0x00050000 | 97) in ins  # RET ERRNO(EAFNOSUPPORT)
    assert {k for code, _, _, k in ins if code == 0x15} >= {41, 53, 1, 2, 10}  # socket(pair)


def test_limits_to_rlimits():
    lim = Limits(timeout_s=1, memory_mb=512, cpus=2.5, max_procs=10, max_file_mb=3, output_bytes=1)
    assert lim.rlimits() == {"RLIMIT_CORE": 0, "RLIMIT_AS": 512 << 20, "RLIMIT_FSIZE": 3 << 20,
                             "RLIMIT_NPROC": 10}
    assert lim.threads == 2
    none = Limits(timeout_s=1, memory_mb=None, cpus=0.5, max_procs=None, max_file_mb=None,
                  output_bytes=1)
    assert none.rlimits() == {"RLIMIT_CORE": 0} and none.threads == 1


def test_bad_arguments_name_the_problem(tmp_path):
    for nice in (-1, 20, 2.5, True):
        with pytest.raises(ValueError, match=r"nice must be an integer in 0\.\.19"):
            Sandbox(backend="subprocess", nice=nice)
    with pytest.raises(ValueError, match="unknown sandbox backend 'chroot'"):
        Sandbox(backend="chroot")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        Sandbox(backend="subprocess", timeout_s=0)
    if os.geteuid() == 0:  # pytest's tmp dirs are mode 700: the dropped uid could not enter
        with pytest.raises(ValueError, match="not traversable by other users"):
            Sandbox(backend="subprocess", python="/usr/bin/python3", work_root=tmp_path / "runs")
    sb = Sandbox(backend="subprocess", python="/usr/bin/python3")
    with pytest.raises(FileNotFoundError, match="input_dir .*/nope is not a directory"):
        sb.run("pass", tmp_path / "nope")
    with pytest.raises(ValueError, match="workdir .*/w lies inside input_dir"):
        sb.run("pass", tmp_path, workdir=tmp_path / "w")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    with pytest.raises(ValueError, match="workdir .*/full is not empty"):
        prepare_workdir("pass", full, tmp_path)


def test_escaping_symlinks_are_listed(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "secret.csv").write_text("x")
    (tmp_path / "in" / "a.csv").write_text("x")
    (tmp_path / "in" / "inside.csv").symlink_to("a.csv")
    (tmp_path / "in" / "leak.csv").symlink_to(tmp_path / "secret.csv")
    assert escaping_symlinks(tmp_path / "in") == ["leak.csv"]


def test_input_warnings_name_unreadable_files(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "ok.csv").write_text("x")
    (inp / "private.csv").write_text("x")
    os.chmod(inp / "private.csv", 0o600)
    ws = input_warnings(inp, check_others=True)
    assert len(ws) == 1 and "not readable by the sandbox uid" in ws[0] and "private.csv" in ws[0]
    assert "ok.csv" not in ws[0]
    assert input_warnings(inp, check_others=False) == []


@pytest.mark.skipif(os.geteuid() != 0 or os.access("/root", os.X_OK) and os.stat("/root").st_mode
                    & 0o001, reason="needs root and an interpreter under a private /root")
def test_subprocess_backend_warns_when_it_cannot_drop_privileges(tmp_path, caplog):
    import sys

    if not os.path.realpath(sys.executable).startswith("/root/"):
        pytest.skip("this interpreter is reachable by other users")
    sb = Sandbox(backend="subprocess", work_root=tmp_path / "runs")
    assert "SANDBOX ISOLATION IS WEAK" in caplog.text
    (tmp_path / "in").mkdir()
    res = sb.run("print('hi')", tmp_path / "in")
    assert res.status == "ok" and res.weak_isolation
    assert any("RLIMIT_NPROC is not enforced" in w for w in res.warnings)


# ----------------------------------------------------------------------------- docker

class _FakeContainer:
    def __init__(self, script: dict, kw: dict):
        self.script, self.kw, self.killed, self.removed = script, kw, False, False
        self.attrs = {"State": {"OOMKilled": script.get("oom", False),
                                "StartedAt": "2026-01-01T00:00:00.000000000Z",
                                "FinishedAt": "2026-01-01T00:00:01.500000000Z"}}

    def start(self):
        wd = Path(self.kw["volumes"] and next(k for k, v in self.kw["volumes"].items()
                                              if v["bind"] == "/workdir"))
        if self.script.get("write"):
            (wd / "submission" / "submission.csv").write_text("id,y\n1,0\n")
        if self.script.get("link"):  # a program making its submission a link to a host file
            os.symlink("/etc/passwd", wd / "submission" / "submission.csv")

    def wait(self, timeout):
        if self.script.get("hang"):
            raise TimeoutError("read timed out")
        return {"StatusCode": self.script.get("code", 0)}

    def kill(self):
        self.killed = True

    def reload(self):
        pass

    def logs(self, stream, stdout, stderr):
        return iter(self.script.get("out" if stdout else "err", []))

    def remove(self, force):
        self.removed = True


class _FakeClient:
    def __init__(self, script: dict):
        self.script, self.created = script, []
        self.containers = self

    def create(self, **kw):
        self.created.append(_FakeContainer(self.script, kw))
        return self.created[-1]


def _docker(tmp_path, script, **kw):
    pytest.importorskip("docker")
    client = _FakeClient(script)
    sb = Sandbox(backend="docker", docker_client=client, work_root=tmp_path / "runs", **kw)
    (tmp_path / "in").mkdir(exist_ok=True)
    return sb, client


def test_docker_container_is_isolated_and_limited(tmp_path):
    sb, client = _docker(tmp_path, {"write": True, "out": [b"a" * 50, b"b" * 50]},
                         memory_mb=512, max_procs=50, max_file_mb=2, cpus=2, output_bytes=20,
                         disk_mb=64, max_inodes=500)
    res = sb.run("print(1)", tmp_path / "in")
    kw = client.created[0].kw
    assert kw["network_mode"] == "none" and kw["read_only"] and kw["cap_drop"] == ["ALL"]
    assert "no-new-privileges" in kw["security_opt"] and kw["init"]
    assert kw["mem_limit"] == kw["memswap_limit"] == "512m" and kw["pids_limit"] == 50
    assert kw["nano_cpus"] == 2_000_000_000 and kw["environment"]["OMP_NUM_THREADS"] == "2"
    fsize = next(u for u in kw["ulimits"] if u.name == "fsize")
    assert fsize.soft == fsize.hard == 2 << 20
    binds = {v["bind"]: v["mode"] for v in kw["volumes"].values()}
    assert binds == {"/workdir": "rw", "/workdir/input": "ro"}
    assert kw["tmpfs"]["/tmp"].split(",") == ["rw", "nosuid", "nodev", "mode=1777", "size=64m",
                                              "nr_inodes=500"]
    assert res.status == "ok" and res.submission_exists and res.duration_s == pytest.approx(1.5)
    assert any("docker container cgroup" in w for w in res.warnings)
    assert res.stdout_bytes == 100 and res.stdout_truncated and client.created[0].removed


@pytest.mark.parametrize("script,status,killed", [
    ({"hang": True}, "timeout", True),
    ({"code": 137, "oom": True}, "oom", False),
    ({"code": 137}, "killed", False),
    ({"code": 1, "err": [b"Traceback\nMemoryError\n"]}, "oom", False),
    ({"code": 2}, "error", False),
])
def test_docker_statuses(tmp_path, script, status, killed):
    sb, client = _docker(tmp_path, script, timeout_s=5)
    res = sb.run("pass", tmp_path / "in")
    assert res.status == status and client.created[0].killed == killed
    assert client.created[0].removed


def test_docker_symlinked_submission_does_not_exist(tmp_path):
    sb, _ = _docker(tmp_path, {"link": True})
    res = sb.run("pass", tmp_path / "in")
    assert res.status == "ok" and not res.submission_exists
    assert res.cleanup() and not os.path.lexists(res.workdir)


def test_docker_engine_end_to_end(tmp_path):
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception as e:  # no engine here (dev machines; CI starts one)
        pytest.skip(f"no Docker engine answers: {type(e).__name__}")
    image = inspect.signature(Sandbox).parameters["image"].default
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        pytest.skip(f"the image {image} is missing: build it with `bash scripts/docker_image.sh`")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.csv").write_text("a\n1\n")
    sb = Sandbox(backend="docker", timeout_s=60, work_root=tmp_path / "runs")
    code = ("import socket\nopen('submission/submission.csv','w').write(open('input/train.csv')"
            ".read())\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
            "    print('NET')\nexcept OSError:\n    print('nonet')\n")
    res = sb.run(code, tmp_path / "in")
    assert res.status == "ok" and res.stdout.strip() == "nonet" and res.submission_exists


def test_seccomp_filter_shape():
    from rl4mle_jax.env.sandbox.seccomp import build_filter

    for machine in ("x86_64", "aarch64"):
        prog = build_filter(machine)
        assert prog is not None and len(prog) % 8 == 0 and 20 < len(prog) // 8 < 64
    assert build_filter("sparc64") is None


# A helper whose child takes the uid and exits; the helper never reaps it (this test process
# may reap every child it has: asyncio's watchers, SIGCHLD ignored by a library).
_ZOMBIE_MAKER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setresuid(int(sys.argv[1]), int(sys.argv[1]), int(sys.argv[1]))
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a process of another uid")
def test_uid_pool_skips_a_uid_whose_killed_processes_are_not_reaped_yet(tmp_path):
    import subprocess
    import sys
    import time

    from rl4mle_jax.env.sandbox.local import UidPool, pids_of_uid

    base = 970000 + os.getpid() % 1000 * 4
    maker = subprocess.Popen([sys.executable, "-c", _ZOMBIE_MAKER, str(base)],
                             stdout=subprocess.PIPE, text=True)
    try:
        pid = int(maker.stdout.readline())
        for _ in range(500):  # a zombie of uid `base` (once it has exited) until its parent goes
            if pids_of_uid(base, zombies=True) and not pids_of_uid(base):
                break
            time.sleep(0.01)
        assert pids_of_uid(base, zombies=True) == [pid] and pids_of_uid(base) == []
        pool = UidPool(base=base, count=2, lock_dir=tmp_path)
        uid, fd = pool.acquire()
        assert uid == base + 1  # its RLIMIT_NPROC still counts the zombie
        pool.release(uid, fd)
    finally:
        maker.kill()
        maker.wait()
    for _ in range(200):  # reparented to init, which reaps it
        if not pids_of_uid(base, zombies=True):
            break
        time.sleep(0.01)
    uid, fd = pool.acquire()
    assert uid == base or pids_of_uid(base, zombies=True)  # free again once reaped
    pool.release(uid, fd)
