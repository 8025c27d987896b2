"""scripts/compare_multitask.py's table from finished runs' files (the runs are the loop's own,
tested in tests/test_multitask.py), and its argument errors."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare_multitask",
                                               ROOT / "scripts" / "compare_multitask.py")
cm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cm)


def _eval(valid, test):
    return {"n": 4, "valid_rate": valid, "paper_protocol_best_test_score": test,
            "pick": {"reward_score": test, "test_score": test}}


def _write(wd, initial, final, metrics):
    wd.mkdir(parents=True)
    (wd / "eval_initial.json").write_text(json.dumps(initial))
    (wd / "eval_final.json").write_text(json.dumps(final))
    (wd / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def test_table_per_task_from_both_arms(tmp_path):
    for t in ("a", "b"):
        _write(tmp_path / "single" / t / "seed0", _eval(0.5, 0.8), _eval(0.75, 0.81),
               [{"step": 3, "wall_s": 9.0, "episodes/trained": 24}])
    _write(tmp_path / "multi" / "seed0", {"n": 4, "tasks": {t: _eval(0.5, 0.8) for t in "ab"}},
           {"n": 4, "tasks": {"a": _eval(1.0, 0.83), "b": _eval(0.25, None)}},
           [{"step": s, "wall_s": s, "task/a/episodes": 3, "task/b/episodes": 5} for s in (1, 2)])
    results = cm.collect(tmp_path, ["a", "b"], [0, 1], 10.0)  # seed 1 not run yet: left out
    a = {r["arm"]: r for r in results["a"]}
    assert a["per-task"] == {"arm": "per-task", "seed": 0, "budget_s": 10.0, "steps": 3,
                             "episodes": 24, "valid_initial": 0.5, "valid_final": 0.75,
                             "test_initial": 0.8, "test_final": 0.81}
    assert a["multi-task"]["budget_s"] == 20.0 and a["multi-task"]["episodes"] == 6
    assert {r["arm"]: r for r in results["b"]}["multi-task"]["episodes"] == 10
    text = cm.markdown(results, "cmd")
    assert "## a" in text and "## b" in text
    assert "| multi-task | 0 | 20 | 2 | 10 | 0.500 → 0.250 | 0.8000 → — |" in text


def test_bad_arguments_name_the_flag(tmp_path, capsys):
    for argv, flag in [(["--tasks", "a", "--budget_s", "1"], "--tasks"),
                       (["--tasks", "a,a", "--budget_s", "1"], "--tasks"),
                       (["--tasks", "a,b", "--budget_s", "0"], "--budget_s")]:
        with pytest.raises(SystemExit):
            cm.main([*argv, "--workdir", str(tmp_path)])
        assert flag in capsys.readouterr().err
