"""The "docker" backend on a real engine: the same record as the local bwrap sandbox for honest
and hostile programs (links to the answers and host files, oversized submissions, forged
milestones, no training, fork bombs, memory hogs, network access), and the container's own
isolation and limits seen from inside (no network, non-root without capabilities, read-only
root, memory / pids / timeout limits), with nothing left behind (containers, run dirs).

Skips, naming which, when no engine answers or the image is missing; both come from
`bash scripts/docker_engine.sh start` (as root: installs docker.io, starts dockerd, builds the
image offline with scripts/docker_image.sh).
"""

import inspect
import json
import os
import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest

docker = pytest.importorskip("docker", reason="the docker extra: pip install -e '.[docker]'")

from rl4mle_jax.env.execute import run_and_grade  # noqa: E402
from rl4mle_jax.env.sandbox import Sandbox  # noqa: E402
from rl4mle_jax.env.sandbox.docker_backend import DEFAULT_IMAGE, LABEL  # noqa: E402
from tests.env.backend_parity import (  # noqa: E402
    HOSTILE,
    HOSTILE_MORE,
    assert_hostile_record_as_reference,
    record,
    task_for_tests,
)
from tests.env.test_execute import HONEST  # noqa: E402

LOCAL = "bwrap" if shutil.which("bwrap") else "subprocess"
HOW = "start an engine and build the image with `bash scripts/docker_engine.sh start` (as root)"
ROOT = os.geteuid() == 0

def _engine():
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as e:
        return None, f"no Docker engine answers ({type(e).__name__}); {HOW}"
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        return None, (f"a Docker engine answers but the image {DEFAULT_IMAGE} is missing: build "
                      "it with `bash scripts/docker_image.sh` (offline)")
    return client, None


@pytest.fixture(scope="module")
def engine():
    client, why = _engine()
    if client is None:
        pytest.skip(why)
    return client


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return task_for_tests(tmp_path_factory)


@pytest.fixture(scope="module")
def sandboxes(engine, tmp_path_factory):
    kw = dict(timeout_s=120, memory_mb=4096)
    dock = Sandbox("docker", work_root=tmp_path_factory.mktemp("druns"), **kw)
    local = Sandbox(LOCAL, work_root=tmp_path_factory.mktemp("runs"), **kw)
    yield dock, local
    dock.close()
    local.close()


def _left(engine, sb) -> list:
    """Containers of ours and run dirs still there."""
    return ([c.name for c in engine.containers.list(all=True, filters={"label": LABEL})]
            + [p.name for p in Path(sb.work_root).glob("run_*")])


def test_default_image_is_the_one_the_script_builds():
    default = inspect.signature(Sandbox).parameters["image"].default
    assert default == DEFAULT_IMAGE
    script = (Path(__file__).parents[2] / "scripts" / "docker_image.sh").read_text()
    name, tag = DEFAULT_IMAGE.split(":")
    assert f"\nNAME={name}\n" in script and "ALIAS=${RL4MLE_DOCKER_IMAGE:-$NAME:" + tag in script


def test_honest_program_same_record_as_bwrap(engine, task, sandboxes):
    dock, local = sandboxes
    t0 = time.monotonic()
    here = run_and_grade(HONEST, task, local)
    t1 = time.monotonic()
    run = run_and_grade(HONEST, task, dock)
    t2 = time.monotonic()
    print(f"honest run: {LOCAL} {t1 - t0:.2f} s, docker {t2 - t1:.2f} s")
    assert run.reward.status == "valid", run.reward.to_json()
    assert record(run) == record(here)
    assert run.exec["backend"] == "docker" and run.reward.duration_s > 0
    if ROOT:  # the same launcher and witness as bwrap
        assert run.reward.evidence_source == here.reward.evidence_source == "witness"
        assert run.reward.witnessed == here.reward.witnessed
    assert not _left(engine, dock)


@pytest.mark.parametrize("name", HOSTILE + HOSTILE_MORE)  # the ray test's and four more
def test_hostile_programs_get_the_localrecord(engine, task, sandboxes, tmp_path, name):
    dock, local = sandboxes
    run = assert_hostile_record_as_reference(name, task, tmp_path, dock, local)
    if name == "fork_bomb":
        forked = re.search(r"fork refused after (\d+)", run.exec["stdout"])
        assert forked and int(forked.group(1)) < 256, run.exec["stdout"][-500:]  # pids_limit
    if name == "memory_hog":
        assert run.exec["status"] == "oom"
    assert not _left(engine, dock)


PROBE = textwrap.dedent("""\
    import json, os, socket
    def attempt(f):
        try:
            f()
            return "ok"
        except OSError as e:
            return type(e).__name__ + ":" + str(e.errno)
    def cg(path):
        try:
            return open("/sys/fs/cgroup/" + path).read().strip()
        except OSError as e:
            return "?" + type(e).__name__
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    out = {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
        "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
        "connect": attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2)),
        "write_root": attempt(lambda: open("/usr/probe", "w")),
        "write_input": attempt(lambda: open("input/probe", "w")),
        "read_status": attempt(lambda: os.listdir(".status")),
        "host_paths": [p for p in ("/work", "/root/.pyenv", "/var/run/docker.sock")
                       if os.path.exists(p)],
        "memory_limit": cg("memory/memory.limit_in_bytes"),
        "pids_max": cg("pids/pids.max"),
        "cfs_quota": cg("cpu/cpu.cfs_quota_us"), "cfs_period": cg("cpu/cpu.cfs_period_us"),
        "input": sorted(os.listdir("input")),
    }
    open("tmp_probe", "w").write("x")
    open("/tmp/probe", "w").write("x")
    open("submission/submission.csv", "w").write("id,y\\n1,0\\n")
    print(json.dumps(out))
    """)


def test_container_is_isolated_and_limited_from_inside(engine, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.csv").write_text("a\n1\n")
    sb = Sandbox("docker", timeout_s=60, memory_mb=512, max_procs=40, cpus=1,
                 work_root=tmp_path / "runs")
    res = sb.run(PROBE, tmp_path / "in")
    assert res.status == "ok", res.stderr
    got = json.loads(res.stdout)
    assert got["uid"] != 0 and got["euid"] != 0 and got["gid"] != 0
    assert int(got["cap_eff"], 16) == 0 and got["no_new_privs"] == "1"
    assert got["connect"] != "ok"  # network "none": no route
    assert got["write_root"] == "OSError:30"  # EROFS: the root is read-only
    assert got["write_input"] in ("OSError:30", "PermissionError:13")
    if ROOT:
        assert got["read_status"] == "PermissionError:13"  # the launcher's channel is private
    assert got["host_paths"] == [] and got["input"] == ["train.csv"]
    assert int(got["memory_limit"]) == 512 << 20
    assert int(got["pids_max"]) == 40
    assert int(got["cfs_quota"]) == int(got["cfs_period"])  # one core
    assert res.submission_exists and res.exit_code == 0
    if ROOT:
        assert res.evidence is not None and res.peak_memory_mb and res.peak_memory_mb > 1
        assert res.cpu_s is not None and res.cpu_s > 0
    assert res.cleanup()
    assert not _left(engine, sb)


def test_network_is_absent(engine, tmp_path):
    (tmp_path / "in").mkdir()
    sb = Sandbox("docker", timeout_s=60, work_root=tmp_path / "runs")
    code = textwrap.dedent("""\
        import socket
        names = [n for _, n in socket.if_nameindex()]
        try:
            socket.getaddrinfo("pypi.org", 443)
            dns = "resolved"
        except OSError:
            dns = "no dns"
        print(sorted(names), dns)
        """)
    res = sb.run(code, tmp_path / "in")
    assert res.status == "ok", res.stderr
    assert res.stdout.strip() == "['lo'] no dns"
    res.cleanup()


def test_memory_over_the_limit_is_oom(engine, tmp_path):
    """Three processes of 150 MB each: every one is under RLIMIT_AS, together over mem_limit."""
    (tmp_path / "in").mkdir()
    code = textwrap.dedent("""\
        import os, time
        parent = True
        for _ in range(2):
            if os.fork() == 0:
                parent = False
                break
        x = b"x" * (150 << 20)
        if parent:  # ends when the first of its children does (the OOM killer's victim)
            os.wait()
            raise SystemExit(1)
        time.sleep(20)
        """)
    for backend in ("docker", LOCAL):
        sb = Sandbox(backend, timeout_s=60, memory_mb=256, work_root=tmp_path / backend)
        res = sb.run(code, tmp_path / "in")
        assert res.status == "oom", (backend, res.status, res.exit_code, res.stderr[-500:])
        assert res.duration_s < 20
        res.cleanup()
        if backend == "docker":
            assert not _left(engine, sb)


def test_timeout_kills_the_container(engine, tmp_path):
    (tmp_path / "in").mkdir()
    sb = Sandbox("docker", timeout_s=3, work_root=tmp_path / "runs")
    t0 = time.monotonic()
    res = sb.run("import time\nprint('started', flush=True)\ntime.sleep(100)\n", tmp_path / "in")
    assert res.status == "timeout" and res.exit_code is None
    assert 3 <= res.duration_s < 10 and time.monotonic() - t0 < 20
    assert "started" in res.stdout  # output up to the kill is kept
    res.cleanup()
    assert not _left(engine, sb)


def test_output_flood_is_capped_and_streamed(engine, tmp_path):
    (tmp_path / "in").mkdir()
    sb = Sandbox("docker", timeout_s=60, output_bytes=4096, work_root=tmp_path / "runs")
    code = ("import sys\nprint('HEAD', flush=True)\nfor _ in range(50):\n"
            "    sys.stdout.write('x' * (1 << 20))\nprint('TAIL')\n"
            "sys.stderr.write('ERR\\n')\n")
    res = sb.run(code, tmp_path / "in")
    assert res.status == "ok", res.stderr
    assert res.stdout_bytes == 50 * (1 << 20) + len("HEAD\nTAIL\n") and res.stdout_truncated
    assert res.stdout.startswith("HEAD") and res.stdout.rstrip().endswith("TAIL")
    assert len(res.stdout) < 8192 and res.stderr == "ERR\n"
    res.cleanup()


def test_missing_image_is_a_clear_error(engine, tmp_path):
    with pytest.raises(RuntimeError, match="scripts/docker_image.sh"):
        Sandbox("docker", image="rl4mle-sandbox:no-such-recipe", work_root=tmp_path)
