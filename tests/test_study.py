"""Study readers: bands across seeds, Δt of trained episodes, the ablation table."""

import json

import numpy as np
import pytest

from rl4mle_jax import study as st


def _write_run(wd, rewards, walls, episodes=(), final=None):
    wd.mkdir(parents=True)
    (wd / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "wall_s": w, "reward/mean": r}) + "\n"
        for i, (r, w) in enumerate(zip(rewards, walls))))
    (wd / "experience.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes)
                                         + "{cut by a crash")
    if final is not None:
        (wd / "eval_final.json").write_text(json.dumps(final))


@pytest.fixture
def study_dir(tmp_path):
    eps = [{"selected": True, "wall_s": 30.0 * k, "duration_s": float(k),
            "record": {"status": "valid" if k >= 2 else "failure"}} for k in range(1, 5)]
    _write_run(tmp_path / "full" / "seed0", [-5.0, -1.0], [60.0, 120.0], eps,
               {"valid_rate": 0.5, "pick": {"reward_score": 0.8, "test_score": 0.7}})
    _write_run(tmp_path / "full" / "seed1", [-3.0, 1.0], [60.0, 180.0], (),
               {"valid_rate": 1.0, "pick": {"reward_score": 0.9, "test_score": 0.8}})
    _write_run(tmp_path / "no_instrumentation" / "seed0", [-9.0], [90.0])
    return tmp_path


def test_band_is_the_mean_and_std_of_step_functions_on_a_common_grid(study_dir):
    study = st.load_study(study_dir)
    assert {v: [r.seed for r in runs] for v, runs in study.items()} == {
        "full": [0, 1], "no_instrumentation": [0]}
    grid, mean, std = st.band(study["full"], "reward/mean", grid_points=3)
    np.testing.assert_allclose(grid, [1.0, 1.5, 2.0])  # minutes, up to the shorter run's end
    ref = np.array([[-5.0, -5.0, -1.0], [-3.0, -3.0, -3.0]])  # each run's last value so far
    np.testing.assert_allclose(mean, ref.mean(0))
    np.testing.assert_allclose(std, ref.std(0))


def test_trained_dt_and_first_valid_and_table(study_dir):
    run = st.load_study(study_dir)["full"][0]
    assert len(run.episodes) == 4  # the cut last line is skipped
    t, dt = st.trained_dt_curve(run, window=2)
    np.testing.assert_allclose(dt, [1.5, 2.5, 3.5])
    np.testing.assert_allclose(t, [1.0, 1.5, 2.0])
    assert st.time_to_first_valid(run) == 60.0
    table = st.ablation_table(st.load_study(study_dir))
    assert "| full | 2 | 0.85 ± 0.05 | 0.75 ± 0.05 | 0.75 ± 0.25 |" in table, table
    assert "| no_instrumentation | 1 | — |" in table


def test_a_single_workdir_is_a_study_of_one_run(study_dir):
    study = st.load_study(study_dir / "full" / "seed0")
    assert list(study) == ["run"] and len(study["run"][0].metrics) == 2


def test_learning_check_quarters_and_before_after(tmp_path):
    rewards = [-9.0, -7.0, -5.0, -4.0, -2.0, -1.0, 0.5, 0.9, 0.8]  # 9 steps: quarters of 2
    wd = tmp_path / "v" / "seed3"
    _write_run(wd, rewards, [10.0 * (i + 1) for i in range(9)],
               final={"n": 32, "direction": "lower", "valid_rate": 0.9,
                      "pick": {"test_score": 0.30}})
    (wd / "eval_initial.json").write_text(json.dumps(
        {"n": 32, "direction": "lower", "valid_rate": 0.6, "pick": {"test_score": 0.35}}))
    c = st.learning_check(st.load_study(tmp_path)["v"][0])
    assert c["seed"] == 3 and c["steps"] == 9 and c["eval_n"] == 32
    np.testing.assert_allclose([c["reward_first"], c["reward_last"]],
                               [np.mean(rewards[:2]), np.mean(rewards[-2:])])
    np.testing.assert_allclose(c["reward_gain"], np.mean(rewards[-2:]) - np.mean(rewards[:2]))
    np.testing.assert_allclose(c["valid_gain"], 0.3)
    np.testing.assert_allclose(c["test_gain"], 0.05)  # lower is better: 0.35 -> 0.30 is a gain
    table = st.learning_table(st.load_study(tmp_path))
    assert "| v | 1 | +8.850 | +0.300 | +0.0500 | yes |" in table, table


def test_learning_check_without_evaluations_or_steps(study_dir):
    c = st.learning_check(st.load_study(study_dir)["no_instrumentation"][0])
    assert c["steps"] == 1 and c["reward_gain"] == 0.0
    assert c["valid_gain"] is None and c["test_gain"] is None
    assert "| no_instrumentation | 1 | +0.000 | — | — | no |" in st.learning_table(
        st.load_study(study_dir))


def test_smoothed_curve_is_a_trailing_moving_mean(study_dir):
    run = st.load_study(study_dir)["full"][0]  # rewards -5, -1
    np.testing.assert_allclose(st.curve(run, "reward/mean", smooth=3)[1], [-5.0, -3.0])
    grid, mean, _ = st.band(st.load_study(study_dir)["full"], "reward/mean", 2, smooth=2)
    # seed0 smoothed: -5, -3 at 1 and 2 min; seed1: -3, -1 at 1 and 3 min (held at -3 at 2 min)
    np.testing.assert_allclose(grid, [1.0, 2.0])
    np.testing.assert_allclose(mean, [(-5 - 3) / 2, (-3 - 3) / 2])


def test_results_page_and_run_command(study_dir):
    page = st.results_markdown(st.load_study(study_dir), "python x.py --config c", 300.0, "t")
    assert page.startswith("# t\n\nCommand: `python x.py --config c`")
    assert "RL budget per run: 300 s wall-clock." in page
    assert "## Ablation table\n\n| variant |" in page
    assert "## Learning checks\n\n| variant |" in page
    assert st.run_command("e.py", ["--config=c", "--only_tables", "--variants=a,b"],
                          drop=("--only_tables", "--variants")) == "python e.py --config=c"


def test_arrival_bias_counts_buckets_and_slope(tmp_path):
    """Started = finished + still running (censored); the slope of log(trained/started) vs
    log Δt is -1 when inclusion ∝ 1/Δt and 0 when nothing is lost."""
    def run_with(kept):  # kept(dt, i) -> selected
        eps = []
        for i, dt in enumerate([1.5] * 8 + [3.0] * 8 + [6.0] * 8 + [12.0] * 8):
            eps.append({"episode_id": i, "duration_s": dt, "selected": kept(dt, i)})
        eps.append({"episode_id": 99, "cancelled": True, "elapsed_s": 5.0, "selected": False})
        return st.Run("v", 0, tmp_path, episodes=eps)

    everything = st.arrival_bias(run_with(lambda dt, i: True))
    assert everything["started"] == 33 and everything["trained"] == 32
    assert everything["cancelled"] == 1
    by_lo = {b["lo"]: b for b in everything["buckets"]}
    assert by_lo[1.0]["started"] == 8 and by_lo[4.0]["started"] == 9  # 8 of 6 s + the censored
    assert by_lo[4.0]["trained"] == 8
    # Nothing lost but the censored one: slope ~0 (numpy reference on the same buckets).
    use = [b for b in everything["buckets"] if b["started"] >= 3 and b["trained"]]
    x = np.log([np.sqrt(b["lo"] * b["hi"]) for b in use])
    y = np.log([b["trained"] / b["started"] for b in use])
    w = np.array([b["started"] for b in use], float)
    ref = np.polyfit(x, y, 1, w=np.sqrt(w))[0]
    assert everything["slope"] == pytest.approx(ref, abs=1e-9)
    assert abs(everything["slope"]) < 0.1
    # Inclusion ∝ 1/Δt (keep 8, 4, 2, 1 of 8 per bucket): slope -1.
    keep = {1.5: 8, 3.0: 4, 6.0: 2, 12.0: 1}
    premise = st.arrival_bias(run_with(lambda dt, i: i % 8 < keep[dt]))
    assert premise["slope"] == pytest.approx(-1.0, abs=0.1)
    assert st.plot_arrival_bias(premise, tmp_path / "arrival.png")
