"""The "ray" backend on a local Ray cluster: the same record as the local sandbox for honest and
hostile programs (links to the answers and host files, oversized submissions, forged milestones,
no training), input shipped once per content, nothing left on the node, clear errors."""

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

from rl4mle_jax.env.execute import run_and_grade  # noqa: E402
from rl4mle_jax.env.sandbox import Sandbox, ray_backend  # noqa: E402
from tests.env.backend_parity import (  # noqa: E402
    HOSTILE,
    assert_hostile_record_as_reference,
    record,
    task_for_tests,
)
from tests.env.test_execute import HONEST  # noqa: E402

INNER = "bwrap" if shutil.which("bwrap") else "subprocess"
NODE_RUNS = Path(tempfile.gettempdir()) / "rl4mle_jax-ray" / "runs"


@pytest.fixture(scope="module")
def cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return task_for_tests(tmp_path_factory)


@pytest.fixture(scope="module")
def sandboxes(cluster, tmp_path_factory):
    kw = dict(timeout_s=120, memory_mb=4096)
    remote = Sandbox("ray", ray_inner=INNER, work_root=tmp_path_factory.mktemp("host"), **kw)
    local = Sandbox(INNER, work_root=tmp_path_factory.mktemp("runs"), **kw)
    yield remote, local
    remote.close()
    local.close()


def _node_runs_left():
    return [p for p in NODE_RUNS.glob("run_*")] if NODE_RUNS.is_dir() else []


def test_honest_program_same_record_as_local_and_input_shipped_once(task, sandboxes):
    remote, local = sandboxes
    runs = [run_and_grade(HONEST, task, remote) for _ in range(2)]
    here = run_and_grade(HONEST, task, local)
    for run in runs:
        assert run.reward.status == "valid", run.reward.to_json()
        assert record(run) == record(here)  # same bytes graded the same way, here
        assert run.reward.duration_s > 0  # Δt as measured on the node
        assert any(w.startswith("ray: ran on node") for w in run.exec["warnings"])
    assert remote._backend.puts == 1  # one split, one content: shipped once
    run_and_grade(HONEST, task, remote, split="test")
    assert remote._backend.puts == 2
    assert not _node_runs_left()


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_programs_get_the_localrecord(task, sandboxes, tmp_path, name):
    remote, local = sandboxes
    assert_hostile_record_as_reference(name, task, tmp_path, remote, local)
    assert not _node_runs_left()


def test_task_cap_is_applied_on_the_host(task, sandboxes):
    """A submission under the global ceiling but over this task's own cap: refused here."""
    from rl4mle_jax.env.submission import submission_byte_cap

    remote, _ = sandboxes
    cap = submission_byte_cap(task, "reward")
    code = ("from sklearn.linear_model import LogisticRegression\n"
            "LogisticRegression().fit([[0], [1]], [0, 1])\n"
            f"open('submission/submission.csv', 'w').write('id,churn\\n' + 'x' * {cap})\n")
    run = run_and_grade(code, task, remote)
    assert run.grade is not None and run.grade.reason == "too_large", run.reward.to_json()


def test_input_packing_is_content_addressed_and_checked(tmp_path):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "a.csv").write_text("x\n1\n")
    (src / "sub" / "b.txt").write_text("b")
    digest, data = ray_backend.pack_input(src)
    assert digest == hashlib.sha256(data).hexdigest()
    os.utime(src / "a.csv", (1, 1))  # when it was written does not change what it holds
    assert ray_backend.pack_input(src)[0] == digest
    root = tmp_path / "node"
    out = ray_backend.node_input_dir(root, digest, lambda: data)
    assert (out / "a.csv").read_text() == "x\n1\n" and (out / "sub" / "b.txt").read_text() == "b"
    assert ray_backend.node_input_dir(root, digest, lambda: 1 / 0) == out  # cached: no fetch
    with pytest.raises(ValueError, match="do not match their digest"):
        ray_backend.node_input_dir(root, "0" * 64, lambda: data)
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="regular files only"):
        ray_backend.pack_input(src)


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install -e \"\.\[ray\]\""):
        ray_backend.import_ray()


def test_cli_runs_one_program_through_ray(task, cluster, tmp_path, capsys):
    from rl4mle_jax.env.__main__ import main

    prog = tmp_path / "solution.py"
    prog.write_text(HONEST)
    main(["run", "--task", str(task.root), "--backend", "ray", str(prog)])
    out = capsys.readouterr().out
    assert "valid" in out and "ray: ran on node" in json.dumps(out)


def test_the_loop_runs_end_to_end_through_ray(cluster, warm_cache, tmp_path):
    from rl4mle_jax.env.tasks import load_task
    from rl4mle_jax.train import train
    from tests.warm import warm_config

    cfg = warm_config(warm_cache)
    cfg.update_from_flattened_dict({
        "env.backend": "ray", "env.ray_inner": INNER, "run.max_steps": 1, "run.batch_size": 4,
        "run.slots": 2, "run.time_budget_s": 0.0, "run.progress": False, "run.eval_samples": 0,
        "instrument.max_new_tokens": 256})
    summary = train(cfg, tmp_path / "run")
    assert summary["loop"]["step"] == 1 and summary["loop"]["episodes_trained"] == 4
    logged = [json.loads(x) for x in (tmp_path / "run" / "experience.jsonl").read_text()
              .splitlines()]
    ran = [e for e in logged if not e.get("cancelled") and e["record"]["exec_status"]]
    assert ran and all(e["record"]["duration_s"] > 0 for e in ran)
    # The programs ran on the node, from its unpacked copy of the reward split.
    digest, _ = ray_backend.pack_input(load_task("food-reviews").input_dir("reward"))
    assert (NODE_RUNS.parent / "inputs" / digest).is_dir()
    assert not _node_runs_left()
