"""scripts/bench_admission.py's numbers, from synthetic workdirs (no training)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "bench_admission.py"
_SPEC = importlib.util.spec_from_file_location("bench_admission", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _workdir(wd: Path, dts, selected, steps):
    """A finished run: episodes of Δt `dts` (wall-clock), `selected` kept, one still running;
    metrics rows (step, wall_s, trained) for `steps`."""
    wd.mkdir(parents=True)
    (wd / "config.json").write_text(json.dumps({"run": {"duration_source": "episode"}}))
    eps = [{"episode_id": i, "started_at": 10.0 * i, "finished_at": 10.0 * i + dt,
            "duration_s": 0.1, "selected": s, "staleness": i % 3}
           for i, (dt, s) in enumerate(zip(dts, selected))]
    eps.append({"episode_id": 99, "cancelled": True, "started_at": 0.0, "elapsed_s": 2.0,
                "selected": False})
    (wd / "experience.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    (wd / "metrics.jsonl").write_text("".join(json.dumps({
        "step": k, "wall_s": w, "episodes/trained": t, "episodes/started": len(dts) + 1,
        "episodes/dropped": float(len(dts) - sum(selected)), "episodes/over_staleness": 1.0,
        "episodes/failed": 0.0, "slots/utilisation": 0.5 + 0.1 * k,
        "slots/admission_idle_frac": 0.1}) + "\n" for k, w, t in steps))
    (wd / "eval_final.json").write_text("{}")


def test_measure_and_ratio_table(tmp_path):
    dts = np.array([1.0, 2.0, 3.0, 4.0, 8.0, 16.0])
    keep = [True, True, True, True, False, False]  # drop_stale lost the two slow ones
    _workdir(tmp_path / "bounded" / "seed0", dts, [True] * 6, [(1, 60.0, 2), (5, 180.0, 10)])
    _workdir(tmp_path / "drop_stale" / "seed0", dts, keep, [(1, 30.0, 2), (2, 90.0, 4)])
    run = bench.st.load_study(tmp_path)["drop_stale"][0]
    m = bench.measure(run)
    assert m["steps"] == 2 and m["utilisation"] == pytest.approx(0.7)
    assert m["steps_per_min"] == pytest.approx(1.0)  # 1 step in the minute from step 1 to 2
    assert m["trained_per_min"] == pytest.approx(2.0)
    kept = dts[np.asarray(keep)]
    for q in (10, 50, 90):
        assert m[f"dt_trained_p{q}"] == pytest.approx(np.percentile(kept, q))
    assert m["dt_trained_mean"] == pytest.approx(kept.mean())
    assert m["dt_started_mean"] == pytest.approx(np.append(dts, 2.0).mean())  # + the censored
    assert m["staleness_trained"] == pytest.approx(np.mean([0, 1, 2, 0]))
    text = bench.table(tmp_path, [0], "# t")
    # bounded: 4 steps in 2 minutes = 2 / min, drop_stale 1 / min
    assert "| learner steps / min (first to last step) | 2.00 | 1.00 | 2.00 |" in text, text
    assert f"| mean Δt trained (s) | {dts.mean():.2f} | {kept.mean():.2f} | " \
           f"{dts.mean() / kept.mean():.2f} |" in text
    assert "| episodes dropped (stale) | 0 | 2 | 0.00 |" in text


def test_slots_must_exceed_the_batch(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--workdir", str(tmp_path), "--slots", "2", "--batch_size", "2"])
