"""scripts/compare_variants.py: its table over study roots, and clear errors for bad roots."""

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "compare_variants", Path(__file__).resolve().parents[1] / "scripts" / "compare_variants.py")
cv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(cv)


def _run(wd, rewards, final=True):
    wd.mkdir(parents=True)
    (wd / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "wall_s": 10.0 * (i + 1), "reward/mean": r}) + "\n"
        for i, r in enumerate(rewards)))
    if final:
        (wd / "eval_final.json").write_text(json.dumps({"n": 4, "valid_rate": 1.0}))
    (wd / "eval_initial.json").write_text(json.dumps({"n": 4, "valid_rate": 0.5}))


def test_compare_variants_pairs_finished_runs_and_names_bad_roots(tmp_path, capsys):
    _run(tmp_path / "s" / "new" / "seed1", [-4.0, -2.0, 0.0, 0.0])
    _run(tmp_path / "s" / "default" / "seed1", [-4.0, -3.0, -2.0, -2.0])
    _run(tmp_path / "s" / "new" / "seed2", [-4.0, 0.0])
    _run(tmp_path / "s" / "default" / "seed2", [-4.0, 0.0], final=False)  # unfinished: left out
    cv.main(["--a", "new", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert "| s | 1 | +0.0 | +2.00 | +0.000 | — |" in out, out
    assert "| **all** | 1 pairs |" in out
    with pytest.raises(SystemExit, match="no variant 'other'"):
        cv.main(["--a", "other", str(tmp_path / "s")])
    with pytest.raises(SystemExit, match="not a directory"):
        cv.main(["--a", "new", str(tmp_path / "nowhere")])
