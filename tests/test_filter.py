"""The solvability filter: its statistics against NumPy references, its rule, and a real run
on the shared warm start (samples, resume with the same draws, refusal of mixed settings, the
command line's tables)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl4mle_jax import filter as filter_lib  # noqa: E402
from tests.warm import WARMSTART_SETTINGS, warm_config  # noqa: E402


def test_separation_matches_a_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = int(rng.integers(2, 6))
        r = rng.choice([-10.0, 0.1, 0.85], size=int(rng.integers(0, 30)))
        groups = [r[i:i + g] for i in range(0, len(r) - len(r) % g, g)]
        want = np.mean([len(set(x.tolist())) > 1 for x in groups]) if groups else None
        got = filter_lib.separation(r, g)
        assert (got is None and want is None) or got == pytest.approx(want)
    assert filter_lib.separation([1.0, 1.0, 2.0, 2.0], 2) == 0.0  # equal within each group
    assert filter_lib.separation([1.0, 2.0, 2.0], 2) == 1.0  # the partial group is left out
    assert filter_lib.separation([1.0, 2.0], 1) is None  # a group of one never separates


def _sample(i, status, reward, score=None, failure=None):
    return {"index": i, "status": status, "reward": reward, "score": score, "failure": failure,
            "duration_s": 1.0, "milestones": [], "code": "x"}


def test_summary_and_rule():
    samples = [_sample(0, "failure", -10.0, failure="syntax_error"),
               _sample(1, "valid", 0.5, 0.5), _sample(2, "valid", 0.3, 0.3),
               _sample(3, "failure", -10.0, failure="syntax_error"),
               _sample(4, "failure", -9.9, failure="runtime_error")]
    rewards = np.array([s["reward"] for s in samples])
    higher = filter_lib.summarise(samples, "higher", 2, filter_lib.FilterRule())
    assert higher["valid_rate"] == pytest.approx(0.4) and higher["n_valid"] == 2
    assert higher["reward_mean"] == pytest.approx(rewards.mean())
    assert higher["reward_std"] == pytest.approx(rewards.std())
    assert higher["separation"] == pytest.approx(1.0)  # (-10, .5) and (.3, -10) both differ
    assert higher["best_score"] == 0.5 and higher["best_index"] == 1
    assert higher["outcomes"] == {"valid": 2, "syntax_error": 2, "runtime_error": 1}
    assert higher["keep"]
    lower = filter_lib.summarise(samples, "lower", 2, filter_lib.FilterRule())
    assert lower["best_score"] == 0.3  # lower is better: the other pick
    strict = filter_lib.summarise(samples, "higher", 2, filter_lib.FilterRule(min_valid=3))
    assert not strict["keep"] and "2 valid < min_valid=3" in strict["reason"]
    flat = [_sample(i, "failure", -10.0, failure="syntax_error") for i in range(4)]
    out = filter_lib.summarise(flat, "higher", 2, filter_lib.FilterRule(min_valid=0,
                                                                         min_separation=0.5))
    assert out["separation"] == 0.0 and not out["keep"] and "separation" in out["reason"]
    assert out["best_score"] is None


@pytest.fixture(scope="module")
def comps(warm_cache, tmp_path_factory):
    from rl4mle_jax.components import build_components

    c = build_components(warm_config(warm_cache), tmp_path_factory.mktemp("unused"))
    yield c
    c.sandbox.close()


def test_filter_task_runs_grades_and_resumes(comps, tmp_path):
    entry = filter_lib.filter_task(comps, tmp_path, n=4, group_size=2, chunk=2, seed=3)
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    samples = sorted((json.loads(x) for x in lines), key=lambda s: s["index"])
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    assert entry["n"] == 4 and entry["task"] == comps.task.id
    for s in samples:  # each sample went through the reward rules of the run
        assert s["status"] in ("valid", "failure", "no_model_training")
        if s["status"] == "valid":
            assert s["score"] is not None and s["reward"] > -1
        else:  # -10 plus 0.1 per witnessed milestone
            assert -10 <= s["reward"] < -9
    assert entry["n_valid"] == sum(s["status"] == "valid" for s in samples)
    assert entry["references"] == comps.task.reference_scores["test"]
    if entry["n_valid"]:
        assert entry["best_test_score"] is not None  # the pick, run once on the test split
        assert json.loads((tmp_path / "test_of_best.json").read_text())["index"] == \
            entry["best_index"]
    # A crash after three samples: the rerun draws the fourth again, identically.
    (tmp_path / "samples.jsonl").write_text("\n".join(lines[:3]) + "\n{\"index\": 3, \"trunc")
    again = filter_lib.filter_task(comps, tmp_path, n=4, group_size=2, chunk=2, seed=3)
    redone = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()
              if x.endswith("}")]
    missing = next(s for s in samples if s["index"] == json.loads(lines[3])["index"])
    assert {k: v for k, v in redone[-1].items() if k != "duration_s"} == \
        {k: v for k, v in missing.items() if k != "duration_s"}
    assert {k: again[k] for k in ("n_valid", "best_score", "separation")} == \
        {k: entry[k] for k in ("n_valid", "best_score", "separation")}
    with pytest.raises(ValueError, match="other settings .*temperature"):
        filter_lib.filter_task(comps, tmp_path, n=4, temperature=1.0, group_size=2, chunk=2,
                               seed=3)


def test_command_line_reports_every_task(warm_cache, tmp_path):
    broken = tmp_path / "broken_task"
    broken.mkdir()
    (broken / "task.json").write_text("{}")
    work = tmp_path / "filter"
    flags = [f"--config.warmstart.cache_dir={warm_cache}", "--config.mesh.data=1"]
    flags += [f"--config.warmstart.settings.{k}={v!r}" for k, v in WARMSTART_SETTINGS.items()]
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "filter.py"), "--tasks",
                          "food-reviews", str(broken), "--n", "2", "--group_size", "2",
                          "--workdir", str(work), *flags],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((work / "filter.json").read_text())
    food, bad = result["tasks"]
    assert food["task"] == "food-reviews" and food["n"] == 2 and "keep" in food
    assert bad["keep"] is False and "does not validate" in bad["error"]
    table = (work / "filter.md").read_text()
    assert "| food-reviews |" in table and "broken_task" in table and "Rule: keep" in table
    assert (work / "filter.png").exists()
