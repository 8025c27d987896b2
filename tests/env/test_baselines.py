"""Baseline programs, run like an agent's (through the sandbox), reproduce their references."""

import shutil

import pytest

from rl4mle_jax.env.baselines import available, baseline_path, measure_reference, run_baseline
from rl4mle_jax.env.datasets import REGISTRY
from rl4mle_jax.env.grading import grade
from rl4mle_jax.env.tasks import list_tasks, load_task, prepare_task


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "rl4mle_tasks"
    for tid in list_tasks():
        prepare_task(tid, root, reference="recorded")
    return root


@pytest.fixture(scope="module")
def sandbox():
    from rl4mle_jax.env.sandbox import Sandbox

    return Sandbox(backend="bwrap" if shutil.which("bwrap") else "subprocess", timeout_s=180)


def _better(direction, a, b):
    return a > b if direction == "higher" else a < b


@pytest.mark.parametrize("tid", sorted(REGISTRY))
def test_baseline_reproduces_reference(data_root, sandbox, tid, tmp_path):
    task = load_task(data_root / tid)
    run = run_baseline(task, "baseline", "reward", timeout_s=180, sandbox=sandbox)
    assert run.reward.exec_status == "ok", run.exec["stderr"][-2000:]
    rep = run.grade
    assert rep.valid, rep
    assert baseline_path(tid).exists()
    ref = task.reference_scores["reward"]["baseline"]
    assert rep.score == pytest.approx(ref, rel=0.02, abs=0.005), (rep.score, ref)
    trivial = grade(task, task.sample_submission_path("reward"), split="reward")
    assert trivial.valid and _better(task.direction, rep.score, trivial.score)


def test_every_task_has_baseline_and_strong_beats_it_on_test(data_root):
    for tid in list_tasks():
        kinds = available(tid)
        assert "baseline" in kinds, tid
        refs = load_task(data_root / tid).reference_scores["test"]
        if "strong" in kinds:
            task = load_task(data_root / tid)
            assert _better(task.direction, refs["strong"], refs["baseline"]), (tid, refs)


def test_measure_reference_matches_recorded(data_root):
    task = load_task(data_root / "meats-composition")
    m = measure_reference(task, kinds=["baseline"])
    for split in ("reward", "test"):
        assert m["scores"][split]["baseline"] == pytest.approx(
            task.reference_scores[split]["baseline"], rel=1e-6)
        assert m["runtime_s"][split]["baseline"] > 0
