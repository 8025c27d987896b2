"""Experience log survives a torn last line and refuses duplicates; solution buffer ranks."""

import json
import random

import pytest

from rl4mle_jax.rollout.buffer import ExperienceLog, SolutionBuffer


def test_log_roundtrip_repair_and_no_duplicates(tmp_path):
    path = tmp_path / "experience.jsonl"
    log = ExperienceLog(path)
    for i in range(3):
        log.append({"episode_id": i, "reward": -10.0 + i})
    log.close()
    # A crash mid-write leaves a partial line; reopening drops it.
    with open(path, "a") as f:
        f.write('{"episode_id": 3, "rew')
    assert [r["episode_id"] for r in ExperienceLog.read(path)] == [0, 1, 2]
    log = ExperienceLog(path)
    assert len(log) == 3 and log.next_episode_id == 3
    with pytest.raises(ValueError, match="episode 1 is already in"):
        log.append({"episode_id": 1})
    log.append({"episode_id": 3, "reward": 0.5})
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["episode_id"] for line in lines] == [0, 1, 2, 3]


def test_log_rejects_foreign_file(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"no_id": 1}\n')
    with pytest.raises(ValueError, match="x.jsonl:1: not an experience record"):
        ExperienceLog(path)


def test_solution_buffer_keeps_best_and_dedupes():
    buf = SolutionBuffer(capacity=2)
    buf.add("a", 0.1)
    buf.add("b", 0.9)
    buf.add("b", 0.9)
    buf.add("c", 0.5)
    assert [item["code"] for item in buf.items] == ["b", "c"]
    rng = random.Random(0)
    counts = {"b": 0, "c": 0}
    for _ in range(300):
        counts[buf.sample(rng)["code"]] += 1
    assert counts["b"] > counts["c"] > 0
    assert SolutionBuffer.from_state_dict(buf.state_dict()).items == buf.items


def test_older_logs_read_under_todays_names(tmp_path):
    path = tmp_path / "experience.jsonl"
    path.write_text(json.dumps({"episode_id": 0, "busy_s": 1.5, "duration_s": 1.5,
                                "timings": {"execute_s": 1.75, "grade_s": 0.1}}) + "\n"
                    + json.dumps({"episode_id": 1, "busy_s": 0.0}) + "\n")
    old, older = ExperienceLog.read(path)
    assert old == {"episode_id": 0, "duration_s": 1.5,
                   "timings": {"sandbox_wall_s": 1.75, "grade_s": 0.1}}
    assert older == {"episode_id": 1, "duration_s": 0.0}
    log = ExperienceLog(path)
    assert log.next_episode_id == 2
    log.close()
