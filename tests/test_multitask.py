"""Multi-task training end to end (config.tasks): one policy on two local tasks, per-task
metrics, evaluations and report, the seeded task draw across a resume, group baselines within
one task, a task dropped after a rescue that brings no separation, and config errors.

The policy is the shared food-reviews warm start (conftest's `warm_cache`) loaded as a Hugging
Face directory for both tasks, so no second warm start is built: on telco-churn it writes
food-reviews programs, which fail there — what the drop test needs."""

import json
from pathlib import Path

import ml_collections
import pytest

from tests.test_train import QUICK, _records
from tests.warm import warm_config

TASKS = ("food-reviews", "telco-churn")


def _config(warm_cache, **overrides):
    cfg = warm_config(warm_cache)
    hf = next(Path(warm_cache).glob("warmstart-*/hf"))
    cfg.update_from_flattened_dict({**QUICK, "tasks": ",".join(TASKS), "model.hf_dir": str(hf),
                                    **overrides})
    return cfg


def test_two_tasks_end_to_end_and_resume(warm_cache, tmp_path):
    from rl4mle_jax.rollout.task_mix import TaskMix
    from rl4mle_jax.train import train

    workdir = tmp_path / "run"
    # RLOO groups of 2 (no critic): the group baseline must compare rows of one task only.
    common = {"run.eval_samples": 2, "learner.advantage_estimator": "rloo",
              "learner.critic": "none", "learner.group_size": 2, "run.warmup": True}
    first = train(_config(warm_cache, **common, **{"run.max_steps": 2}), workdir)
    assert first["loop"]["step"] == 2
    # The warm-up compiled the step from both tasks' initial lengths (stand-in rows of a
    # task, as the group ids need).
    assert first["warmup"]["train_step_shapes"]
    drawn_before = first["task_mix"]["drawn"]
    summary = train(_config(warm_cache, **common, **{"run.max_steps": 4}), workdir)  # resumes
    assert summary["loop"]["step"] == 4
    # The draw continued from the checkpoint (counts carried on) and is the seeded function of
    # the episode id in both processes (uniform: the weights never change).
    assert all(summary["task_mix"]["drawn"][t] >= drawn_before[t] for t in TASKS)
    episodes = [e for e in _records(workdir / "experience.jsonl") if "task" in e]
    ref = TaskMix(list(TASKS), seed=0)
    assert all(e["task"] == ref.draw(e["episode_id"]) for e in episodes)
    trained = [e for e in episodes if not e.get("cancelled")]
    assert {e["task"] for e in trained} == set(TASKS), "a task got no episodes"
    for e in trained:  # each episode ran and was graded on its own task
        grade = e["record"]["grade"]
        assert grade is None or grade["task_id"] == e["task"]
    # Per-task metrics at every step; the single-task names stay for the whole batch.
    metrics = _records(workdir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert "reward/mean" in m and "score/best" not in m
        assert sum(m[f"task/{t}/episodes"] for t in TASKS) == 4
        assert abs(sum(m[f"task/{t}/sampling_prob"] for t in TASKS) - 1.0) < 1e-9
        for t in TASKS:
            if m[f"task/{t}/episodes"]:
                assert {f"task/{t}/reward_mean", f"task/{t}/valid_rate"} <= set(m)
    # Best-of-N per task, before and after, in the per-task structure.
    for name in ("eval_initial.json", "eval_final.json"):
        ev = json.loads((workdir / name).read_text())
        assert set(ev["tasks"]) == set(TASKS)
        assert all(ev["tasks"][t]["n"] == 2 for t in TASKS)
    assert summary["final"].keys() == set(TASKS)
    report = (workdir / "report.md").read_text()
    assert all(f"## {t}" in report for t in TASKS) and "2 tasks, one policy" in report
    plots = {p.name for p in (workdir / "plots").iterdir()}
    assert {"tasks_reward.png", "tasks_valid_rate.png", "tasks_sampling.png", "reward.png"} <= plots
    meta_tasks = {p.name for p in (workdir / "best_solution").iterdir()} if (
        workdir / "best_solution").exists() else set()
    assert meta_tasks <= set(TASKS)


def test_a_task_without_separation_after_a_rescue_is_dropped(warm_cache, tmp_path,
                                                             monkeypatch):
    """Failures all score −10 (no milestone credit), so telco-churn, where this policy writes
    food-reviews programs, shows no separation; one rescue later it leaves the mix."""
    import rl4mle_jax.train as train_mod

    # A reference for every task (with hf_dir there are no demonstrations to take it from).
    monkeypatch.setattr(train_mod, "load_references", lambda comps, _file="": [
        {"origin": "test reference", "plan": "Print.", "code": "print(1)\n", "reward": 5.0,
         "score": None}])
    cfg = _config(warm_cache, **{
        "run.max_steps": 8, "run.eval_samples": 0, "reward.milestone_reward": 0.0,
        "rescue.enabled": True, "rescue.window_steps": 1, "rescue.patience_steps": 1,
        "rescue.sft_steps": 2, "rescue.max_rescues": 1})
    summary = train_mod.train(cfg, tmp_path / "run")
    events = _records(tmp_path / "run" / "rescues.jsonl")
    drops = [e for e in events if e["event"] == "drop"]
    assert drops, events
    drop = drops[0]
    assert drop["task"] in TASKS and drop["live"] == [t for t in TASKS if t != drop["task"]]
    assert any(e["event"] == "rescue" and e["task"] == drop["task"] for e in events)
    # Not drawn again: its count froze at the drop, and no later-started episode is its.
    assert summary["task_mix"]["drawn"][drop["task"]] == drop["drawn"]
    assert drop["task"] in summary["task_mix"]["dropped"]
    metrics = _records(tmp_path / "run" / "metrics.jsonl")
    after = [m for m in metrics if m["step"] >= drop["step"]]
    assert all(m[f"task/{drop['task']}/dropped"] == 1.0 for m in after)
    assert all(m[f"task/{drop['task']}/sampling_prob"] == 0.0 for m in after)


def test_multitask_config_errors_name_the_field(tmp_path):
    from rl4mle_jax.components import validate_config

    for overrides, field in [
        ({"tasks": "food-reviews,,digits"}, "config.tasks"),
        ({"tasks": "digits,digits"}, "config.tasks"),
        ({"tasks": "digits,food-reviews", "rescue.reference_file": "/x.py"},
         "config.rescue.reference_file"),
        ({"run.task_sampling": "greedy"}, "config.run.task_sampling"),
        ({"run.task_sampling_floor": 1.5}, "config.run.task_sampling_floor"),
        ({"run.task_separation_group": 1}, "config.run.task_separation_group"),
        ({"run.task_separation_window": 2}, "config.run.task_separation_window"),
    ]:
        cfg = warm_config(tmp_path)
        cfg.update_from_flattened_dict(overrides)
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            validate_config(cfg)


def test_single_task_initial_eval_key_is_unchanged(tmp_path):
    """config.tasks = "" leaves the key of single-task runs as it was before the field."""
    from rl4mle_jax.train import initial_eval_key

    cfg = warm_config(tmp_path)
    old = ml_collections.ConfigDict(cfg.to_dict())
    del old["tasks"]
    assert initial_eval_key(cfg) == initial_eval_key(old)
    cfg.tasks = "food-reviews,digits"
    assert initial_eval_key(cfg) != initial_eval_key(old)
