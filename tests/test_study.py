"""Study readers: bands across seeds, Δt of trained episodes, the ablation table."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rl4mle_jax import arrival_replay as ar
from rl4mle_jax import study as st
from rl4mle_jax.rl.arrival import ArrivalModel
from rl4mle_jax.rollout.collate import episode_durations


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


def test_runs_are_in_seed_order_by_number(tmp_path):
    for k in (10, 8, 9):
        _write_run(tmp_path / "default" / f"seed{k}", [-1.0], [60.0])
    (tmp_path / "default" / "seedx").mkdir()
    assert [r.seed for r in st.load_study(tmp_path)["default"]] == [8, 9, 10]


def test_trained_dt_and_first_valid_and_table(study_dir):
    run = st.load_study(study_dir)["full"][0]
    assert len(run.episodes) == 4  # the cut last line is skipped
    t, dt = st.trained_dt_curve(run, window=2)
    np.testing.assert_allclose(dt, [1.5, 2.5, 3.5])
    np.testing.assert_allclose(t, [1.0, 1.5, 2.0])
    assert st.time_to_first_valid(run) == 60.0
    # Rows logged out of finishing order are put back in it.
    run.episodes[:] = run.episodes[::-1]
    t, dt = st.trained_dt_curve(run, window=2)
    np.testing.assert_allclose(dt, [1.5, 2.5, 3.5])
    np.testing.assert_allclose(t, [1.0, 1.5, 2.0])
    grid, mean, std = st.grid_band([(t, dt), (np.array([1.0, 1.8]), np.array([5.0, 7.0]))], 3)
    np.testing.assert_allclose(grid, [1.0, 1.4, 1.8])
    np.testing.assert_allclose(mean, [(1.5 + 5) / 2, (1.5 + 5) / 2, (2.5 + 7) / 2])
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
    # Its standard error from the batch noise: each quarter's sample variance over its steps.
    se = np.sqrt((np.var(rewards[:2], ddof=1) + np.var(rewards[-2:], ddof=1)) / 2)
    np.testing.assert_allclose(c["reward_gain_se"], se)
    table = st.learning_table(st.load_study(tmp_path))
    assert f"| -8.000 | 0.850 | +8.850 ± {se:.3f} | 0.600 |" in table, table
    assert f"| v | 1 | +8.850 ± {se:.3f} | +0.300 | +0.0500 | yes |" in table, table
    # Two runs: the mean's standard error is the root of the summed variances over 2; a run
    # with a quarter of one step has none, and then neither has the mean.
    wd2 = tmp_path / "v" / "seed4"
    rewards2 = [-6.0, -8.0, -3.0, -1.0, 0.0, 1.0, 0.2, 0.6]
    _write_run(wd2, rewards2, [10.0 * (i + 1) for i in range(8)], final=None)
    se2 = np.sqrt((np.var(rewards2[:2], ddof=1) + np.var(rewards2[-2:], ddof=1)) / 2)
    gain = np.mean([np.mean(rewards[-2:]) - np.mean(rewards[:2]),
                    np.mean(rewards2[-2:]) - np.mean(rewards2[:2])])
    table = st.learning_table(st.load_study(tmp_path))
    assert f"| v | 2 | {gain:+.3f} ± {np.sqrt(se ** 2 + se2 ** 2) / 2:.3f} |" in table, table
    (wd2 / "metrics.jsonl").write_text("".join(  # 7 steps: quarters of one step
        json.dumps({"step": i + 1, "wall_s": 10.0 * (i + 1), "reward/mean": r}) + "\n"
        for i, r in enumerate(rewards2[:7])))
    assert st.learning_check(st.load_study(tmp_path)["v"][1])["reward_gain_se"] is None
    table = st.learning_table(st.load_study(tmp_path))
    gain = np.mean([np.mean(rewards[-2:]) - np.mean(rewards[:2]), rewards2[6] - rewards2[0]])
    assert f"| v | 2 | {gain:+.3f} | " in table, table


def test_test_gain_standard_error_pairs_the_picks_replicates(tmp_path):
    """The picks' test-score replicates (same resamples) give the change's standard error; the
    table shows it per run and, for the mean over seeds, the root of the summed variances / n."""
    rng = np.random.default_rng(0)
    common = rng.normal(0, 0.03, 64)  # what the two picks share on each resample
    for seed, (t0, t1) in enumerate([(0.86, 0.85), (0.85, 0.87)]):
        wd = tmp_path / "v" / f"seed{seed}"
        b0 = (t0 + common + rng.normal(0, 0.01, 64)).tolist()
        b1 = (t1 + common + rng.normal(0, 0.01, 64)).tolist()
        b1[5] = float("nan")  # a resample where the metric is undefined
        _write_run(wd, [-3.0, 0.0], [60.0, 120.0], final={
            "n": 32, "direction": "higher", "valid_rate": 1.0,
            "pick": {"test_score": t1, "test_score_boot": b1}})
        (wd / "eval_initial.json").write_text(json.dumps(
            {"n": 32, "direction": "higher", "valid_rate": 0.5,
             "pick": {"test_score": t0, "test_score_boot": b0}}))
    runs = st.load_study(tmp_path)["v"]
    checks = [st.learning_check(r) for r in runs]
    ses = []
    for c, r in zip(checks, runs):
        d = np.subtract(r.final["pick"]["test_score_boot"], r.initial["pick"]["test_score_boot"])
        ses.append(np.std(d[np.isfinite(d)], ddof=1))
        np.testing.assert_allclose(c["test_gain_se"], ses[-1])
        assert 0.008 < c["test_gain_se"] < 0.02  # the shared part cancels
    table = st.learning_table(st.load_study(tmp_path))
    assert f"| -0.0100 ± {ses[0]:.4f} |" in table, table
    mean_se = np.sqrt(ses[0] ** 2 + ses[1] ** 2) / 2
    assert f"| +0.0050 ± {mean_se:.4f} | yes |" in table, table
    # Missing or unequal replicates: no standard error, and none for the mean either.
    assert st.paired_se(None, [0.1] * 64) is None and st.paired_se([0.1] * 64, [0.1] * 63) is None
    assert st.paired_se([0.1] * 8, [0.2] * 8) is None  # too few to estimate
    (tmp_path / "v" / "seed1" / "eval_initial.json").write_text(json.dumps(
        {"n": 32, "direction": "higher", "valid_rate": 0.5, "pick": {"test_score": 0.85}}))
    table = st.learning_table(st.load_study(tmp_path))
    assert "| +0.0050 | yes |" in table, table


def test_valid_rate_by_prompt_kind(tmp_path):
    # 8 trained episodes (quarters of 2), one cancelled and one dropped that must not count
    kinds = ["solve", "improve", "solve", "improve", "solve", "improve", "solve", "improve"]
    valid = [False, False, True, False, True, True, True, True]
    eps = [{"kind": k, "selected": True, "record": {"status": "valid" if v else "failure"}}
           for k, v in zip(kinds, valid)]
    eps.insert(3, {"kind": "solve", "cancelled": True, "selected": False, "record": None})
    eps.insert(5, {"kind": "improve", "selected": False, "record": {"status": "failure"}})
    wd = tmp_path / "v" / "seed0"
    by_kind = {"solve": {"n": 16, "valid": 12}, "improve": {"n": 16, "valid": 13}}
    _write_run(wd, [-1.0], [60.0], eps, final={"n": 32, "valid_rate": 0.78, "by_kind": by_kind})
    (wd / "eval_initial.json").write_text(json.dumps(
        {"n": 32, "valid_rate": 0.66, "by_kind": {"solve": {"n": 16, "valid": 14},
                                                   "improve": {"n": 0, "valid": 0}}}))
    by = st.learning_check(st.load_study(tmp_path)["v"][0])["by_kind"]
    assert by["solve"] == {"eval_initial": 14 / 16, "eval_final": 12 / 16,
                           "train_first": 0.0, "train_last": 1.0}
    assert by["improve"] == {"eval_initial": None, "eval_final": 13 / 16,
                             "train_first": 0.0, "train_last": 1.0}
    table = st.kind_table(st.load_study(tmp_path))
    assert "| v | 0 | 0.88 → 0.75 | 0.00 → 1.00 | — → 0.81 | 0.00 → 1.00 |" in table, table


def test_parent_cut_counts_trained_improve_episodes_by_whether_the_parent_was_cut(tmp_path):
    rec = lambda v: {"status": "valid" if v else "failure"}  # noqa: E731
    eps = [{"kind": "improve", "selected": True, "parent_lines_omitted": n, "record": rec(v)}
           for n, v in [(0, True), (0, True), (10, False), (4, True), (7, False)]]
    eps += [{"kind": "improve", "selected": False, "parent_lines_omitted": 3, "record": rec(0)},
            {"kind": "solve", "selected": True, "parent_lines_omitted": None, "record": rec(1)}]
    wd = tmp_path / "v" / "seed0"
    _write_run(wd, [-1.0], [60.0], eps)
    run = st.load_study(tmp_path)["v"][0]
    assert st.parent_cut(run) == {"n": 5, "cut": 3, "valid_cut": 1 / 3, "valid_whole": 1.0}
    run.episodes = [{k: v for k, v in e.items() if k != "parent_lines_omitted"} for e in eps]
    assert st.parent_cut(run) is None  # a log from before the field


def test_improve_vs_parent_against_numpy(tmp_path):
    """Child minus parent in the reward's scale, over trained improve episodes whose parent is
    in the log and both valid; the valid share over all of them."""
    rec = lambda s: ({"status": "valid", "normalised_score": s} if s is not None  # noqa: E731
                     else {"status": "failure", "normalised_score": None})
    eps = [{"episode_id": 1, "kind": "solve", "selected": True, "record": rec(-0.5)},
           {"episode_id": 2, "kind": "solve", "selected": False, "record": rec(-0.6)},
           {"episode_id": 3, "kind": "solve", "selected": True, "record": rec(None)}]
    kids = [(1, -0.4), (1, -0.5), (2, -0.7), (2, None), (3, -0.2), (1, -0.9)]
    eps += [{"episode_id": 10 + i, "kind": "improve", "selected": True, "parent_episode": p,
             "record": rec(s)} for i, (p, s) in enumerate(kids)]
    eps += [{"episode_id": 30, "kind": "improve", "selected": True, "parent_episode": 99,
             "record": rec(0.0)},  # parent not logged (e.g. from an earlier run): left out
            {"episode_id": 31, "kind": "improve", "selected": False, "parent_episode": 1,
             "record": rec(0.0)}]  # not trained
    wd = tmp_path / "v" / "seed0"
    _write_run(wd, [-1.0], [60.0], eps)
    got = st.improve_vs_parent(st.load_study(tmp_path)["v"][0])
    d = np.array([-0.4 + 0.5, 0.0, -0.7 + 0.6, -0.9 + 0.5])
    assert got["n"] == 6 and got["valid"] == pytest.approx(5 / 6) and got["pairs"] == 4
    assert got["better"] == 0.25 and got["same"] == 0.25 and got["worse"] == 0.5
    assert got["mean_change"] == pytest.approx(d.mean())
    table = st.parent_table(st.load_study(tmp_path))
    assert f"| v | 0 | 6 | 0.83 | 4 | 0.25 / 0.25 / 0.50 | {d.mean():+.4f} |" in table, table
    run = st.load_study(tmp_path)["v"][0]
    run.episodes = [e for e in eps if e["kind"] == "solve"]
    assert st.improve_vs_parent(run) is None


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


def test_results_page_reports_the_budgets_the_runs_recorded(study_dir):
    """A variant that overrides run.time_budget_s is reported with its own budget, and the
    budget given (the base config's) only when no run recorded one (full/seed1 has no
    config.json and does not count)."""
    write = lambda v, b: (study_dir / v / "seed0" / "config.json").write_text(  # noqa: E731
        json.dumps({"run": {"time_budget_s": b}}))
    write("full", 300.0)
    write("no_instrumentation", 600.0)
    page = st.results_markdown(st.load_study(study_dir), "python x.py", 300.0)
    assert "RL budget per run: 300 s (full); 600 s (no_instrumentation) wall-clock." in page
    write("no_instrumentation", 300.0)
    page = st.results_markdown(st.load_study(study_dir), "python x.py", 100.0)
    assert "RL budget per run: 300 s wall-clock." in page
    for v in ("full", "no_instrumentation"):
        (study_dir / v / "seed0" / "config.json").unlink()
    page = st.results_markdown(st.load_study(study_dir), "python x.py", 100.0)
    assert "RL budget per run: 100 s wall-clock." in page


def test_results_page_and_run_command(study_dir):
    page = st.results_markdown(st.load_study(study_dir), "python x.py --config c", 300.0, "t")
    assert page.startswith("# t\n\nCommand: `python x.py --config c`")
    assert "RL budget per run: 300 s wall-clock." in page
    assert "## Ablation table\n\n| variant |" in page
    assert "## Learning checks\n\n| variant |" in page
    assert "## Learner compiles\n\n| variant | seed | steps |" in page
    assert st.run_command("e.py", ["--config=c", "--only_tables", "--variants=a,b"],
                          drop=("--only_tables", "--variants")) == "python e.py --config=c"
    assert st.run_command("e.py", ["--config", "c", "--variants", "a,b", "--workdir", "w"],
                          drop=("--variants",)) == "python e.py --config c --workdir w"
    assert st.run_command("e.py", ["--only_tables", "--workdir", "w"],
                          drop=("--only_tables",)) == "python e.py --workdir w"


EDGES = 2.0 ** (np.arange(-4, 14) + 0.5)  # the ArrivalModel's default Δt bucket edges (s)


def _arrival_run(tmp_path, kept, source="episode"):
    """8 episodes at each of Δt 1.5, 3, 6, 12 s (`kept(dt, i)`: trained), one failed after 2 s,
    one still running at the end (5 s elapsed); Δt as the loop measures it for `source`:
    finished_at − started_at (the sandbox's duration_s is a third of it)."""
    eps = []
    for i, dt in enumerate([1.5] * 8 + [3.0] * 8 + [6.0] * 8 + [12.0] * 8):
        eps.append({"episode_id": i, "started_at": 100.0 + i, "finished_at": 100.0 + i + dt,
                    "duration_s": dt / 3, "selected": kept(dt, i)})
    eps.append({"episode_id": 40, "error": "boom", "started_at": 0.0, "finished_at": 2.0,
                "elapsed_s": 2.0, "selected": False})
    eps.append({"episode_id": 41, "cancelled": True, "started_at": 150.0, "elapsed_s": 5.0,
                "selected": False})
    return st.Run("v", 0, tmp_path, episodes=eps,
                  config={"run": {"duration_source": source, "duration_floor_s": 0.05}})


def test_arrival_bias_counts_buckets_and_p_hat_against_numpy(tmp_path):
    """Per bucket: started (= finished here, nothing cancelled), trained, their ratio and p̂ =
    (trained_b + 2 q̄) / (finished_b + 2), q̄ = Σ trained / Σ finished (the prior of 2
    pseudo-episodes); the still-running episode is censored, not started-and-lost."""
    keep = {1.5: 8, 3.0: 4, 6.0: 2, 12.0: 1}  # inclusion ∝ 1/Δt
    bias = ar.arrival_bias(_arrival_run(tmp_path, lambda dt, i: i % 8 < keep[dt]))
    assert (bias["started"], bias["trained"], bias["dropped"], bias["censored"]) == (34, 15, 18, 1)
    assert bias["duration_source"] == "episode"
    dt = np.array([1.5] * 8 + [3.0] * 8 + [6.0] * 8 + [12.0] * 8 + [2.0])
    trained = np.array([i % 8 < keep[d] for i, d in enumerate(dt[:32])] + [False])
    started_ref = np.histogram(dt, np.concatenate([[0], EDGES, [np.inf]]))[0]
    trained_ref = np.histogram(dt[trained], np.concatenate([[0], EDGES, [np.inf]]))[0]
    q_bar = trained.sum() / len(dt)
    p_ref = (trained_ref + 2 * q_bar) / (started_ref + 2)
    first = int(np.searchsorted(EDGES, 1.5, side="right"))  # [1.41, 2.83) s
    got = bias["buckets"]
    assert [b["lo_s"] for b in got] == pytest.approx(EDGES[first - 1:first + 3])
    np.testing.assert_allclose([b["started"] for b in got], started_ref[first:first + 4])
    np.testing.assert_array_equal([b["trained"] for b in got], trained_ref[first:first + 4])
    np.testing.assert_allclose([b["rate"] for b in got],
                               trained_ref[first:first + 4] / started_ref[first:first + 4])
    np.testing.assert_allclose([b["inclusion"] for b in got], p_ref[first:first + 4], rtol=1e-6)
    np.testing.assert_allclose([b["at_s"] for b in got], [(8 * 1.5 + 2.0) / 9, 3.0, 6.0, 12.0])
    assert [b["censored"] for b in got] == [0, 1, 0, 0]  # the 5 s one, in [2.83, 5.66)
    # Slope of log ratio vs log mean Δt, weighted by started: numpy reference.
    x, y = np.log([b["at_s"] for b in got]), np.log([b["rate"] for b in got])
    ref = np.polyfit(x, y, 1, w=np.sqrt([b["started"] for b in got]))[0]
    assert bias["slope"] == pytest.approx(ref, abs=1e-9)
    assert bias["slope"] == pytest.approx(-1.0, abs=0.1)


def test_arrival_bias_replays_what_the_loop_counted(tmp_path):
    """The replay gives the live ArrivalModel's table: the same events with the same Δt (the
    run's duration_source and floor) as train.py feeds it."""
    for source in ("episode", "execution"):
        run = _arrival_run(tmp_path, lambda dt, i: i % 3 > 0, source)
        live = ArrivalModel()
        for e in run.episodes:
            live.started(e["episode_id"], e["started_at"])
            if e.get("cancelled"):
                live.cancelled(e["episode_id"], e["elapsed_s"], at_shutdown=True)
            elif "error" in e:
                live.finished(e["episode_id"], e["elapsed_s"], trained=False)
            else:
                live.finished(e["episode_id"], float(episode_durations(
                    [SimpleNamespace(**e)], source, 0.05)[0]), trained=e["selected"])
        assert json.dumps(ar.arrival_model(run).table()) == json.dumps(live.table())  # NaN too
    nothing_lost = ar.arrival_bias(_arrival_run(tmp_path, lambda dt, i: True))
    for b in nothing_lost["buckets"]:  # only the failed episode is lost: q̄ = 32/33
        assert b["inclusion"] == pytest.approx((b["trained"] + 2 * 32 / 33) / (b["started"] + 2))
    assert abs(nothing_lost["slope"]) < 0.1


def _check_run(wd, rewards, valid, test, task, direction="higher"):
    _write_run(wd, rewards, [10.0 * (i + 1) for i in range(len(rewards))],
               final={"n": 32, "direction": direction, "valid_rate": valid[1],
                      "pick": {"test_score": test[1]}})
    (wd / "eval_initial.json").write_text(json.dumps(
        {"n": 32, "direction": direction, "valid_rate": valid[0],
         "pick": {"test_score": test[0]}}))
    (wd / "config.json").write_text(json.dumps({"task": task}))


def test_pooled_learning_table_against_numpy(tmp_path):
    """Per study the means over its seeds; pooled, the mean ± sample std / sqrt(n) over every
    run and how many runs meet each goal; a lower-is-better task's pick change is oriented."""
    rng = np.random.default_rng(3)
    rows = []  # (reward gain, valid gain, test gain) per run
    for root, task, direction in (("a", "/x/food-reviews", "higher"),
                                  ("b", "/y/leaf-species", "lower")):
        for seed in range(3):
            r = rng.normal(-3, 1, 8) + np.linspace(0, rng.uniform(0, 4), 8)
            v0, v1 = rng.choice([0.5, 0.625, 0.75], 2)
            t0, t1 = (0.8, 0.8 + rng.choice([-0.01, 0.0, 0.02]))
            _check_run(tmp_path / root / "default" / f"seed{seed}", r.tolist(), (v0, v1),
                       (t0, t1), task, direction)
            sign = 1.0 if direction == "higher" else -1.0
            rows.append((r[-2:].mean() - r[:2].mean(), v1 - v0, sign * (t1 - t0)))
    groups = {k: st.load_study(tmp_path / k)["default"] for k in ("a", "b")}
    assert st.run_task(groups["b"][0]) == "/y/leaf-species"
    table = st.pooled_learning_table(groups)
    rows = np.array(rows)
    for i, name in enumerate(("a", "b")):
        m = rows[3 * i:3 * i + 3].mean(0)
        met = int(m[0] >= 2.0) + int(m[1] >= 0.25) + int(m[2] >= 0)
        assert (f"| {name} | 3 | 8.0 | {m[0]:+.2f} | {m[1]:+.3f} | {m[2]:+.4f} | {met} of 3 |"
                in table), table
    m, se = rows.mean(0), rows.std(0, ddof=1) / np.sqrt(6)
    meet = [(rows[:, j] >= g).sum() for j, g in enumerate((2.0, 0.25, 0.0))]
    assert f"| {m[0]:+.2f} ± {se[0]:.2f} ({meet[0]} of 6 runs meet it) |" in table, table
    assert f"{m[1]:+.3f} ± {se[1]:.3f} ({meet[1]} of 6 runs meet it)" in table, table
    assert f"{m[2]:+.4f} ± {se[2]:.4f} ({meet[2]} of 6 runs meet it)" in table, table
    t = rows[:, 2]
    assert (f"worse on {(t < 0).sum()}, the same on {(t == 0).sum()}, better on "
            f"{(t > 0).sum()}.") in table, table


def test_learning_summary_script_groups_by_root_and_skips_unfinished(tmp_path, capsys):
    path = Path(__file__).resolve().parents[1] / "scripts" / "learning_summary.py"
    spec = importlib.util.spec_from_file_location("learning_summary", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for root in ("r1", "r2"):  # one task, two roots: two rows, never merged
        for seed in (0, 1):
            _check_run(tmp_path / root / "default" / f"seed{seed}", [-4.0, -1.0],
                       (0.5, 0.75), (0.8, 0.8), "food-reviews")
    _check_run(tmp_path / "r1" / "other" / "seed0", [-4.0, -1.0], (0.5, 0.75), (0.8, 0.8),
               "food-reviews")
    (tmp_path / "r2" / "default" / "seed1" / "eval_final.json").unlink()  # still running
    groups = script.groups_of([str(tmp_path / "r1") + ":default", str(tmp_path / "r2")])
    assert {k: len(v) for k, v in groups.items()} == {
        "food-reviews (default, r1)": 2, "food-reviews (default, r2)": 1}
    assert "unfinished" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no variant 'nope'"):
        script.groups_of([str(tmp_path / "r1") + ":nope"])
    script.main([str(tmp_path / "r1")])
    out = capsys.readouterr().out
    assert "| food-reviews (other, r1) | 1 |" in out and "| **all** | 3 |" in out


def test_compile_table_against_numpy(tmp_path):
    """Per run: steps, compiles inside steps, padded steps, the last compiled-ahead and
    declined counts, summed waits and step times, the median of the steps without a compile;
    then the variant's mean over seeds. A run without the keys (an older loop) shows "—"."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in (0, 1):
        n = 12
        inside = rng.random(n) < 0.25
        step_s = rng.uniform(1, 3, n) + 20 * inside
        rows = [{"step": i + 1, "wall_s": 10.0 * i, "time/train_step_s": float(step_s[i]),
                 "learner/compiled_in_step": float(inside[i]),
                 "learner/padded_to_compiled": float(i % 3 == 0),
                 "learner/compiled_ahead": float(min(i, 3)),
                 "learner/compile_ahead_declined": float(i > 5),
                 "time/compile_ahead_wait_s": 0.5 * (i == 4)} for i in range(n)]
        runs.append(st.Run("v", seed, tmp_path, metrics=rows))
        c = st.compile_stats(runs[-1])
        assert c["steps"] == n and c["compiled in a step"] == inside.sum()
        assert c["padded to a compiled shape"] == 4 and c["compiled ahead"] == 3
        assert c["declined"] == 1 and c["compile-ahead wait (s)"] == 0.5
        assert c["train steps (s)"] == pytest.approx(step_s.sum())
        assert c["median step (s)"] == pytest.approx(np.median(step_s[~inside]))
    old = st.Run("old", 0, tmp_path, metrics=[{"step": 1, "wall_s": 1.0}])
    assert st.compile_stats(old)["declined"] is None
    table = st.compile_table({"v": runs, "old": [old]})
    mean_steps = np.mean([st.compile_stats(r)["train steps (s)"] for r in runs])
    assert "| v | mean of 2 | 12 | " in table and f"{mean_steps:.4g}" in table
    assert "| old | 0 | 1 | — |" in table


def test_paired_table_differences_two_variants_seed_by_seed(tmp_path):
    """A − B per seed both ran (a seed only one variant ran is left out), then the mean
    difference ± sample std / sqrt(n) over the pairs and how many favour each, against NumPy."""
    rng = np.random.default_rng(7)
    diffs = []
    for root, seeds in (("s1", (0, 1, 2)), ("s2", (5, 6))):
        for seed in seeds:
            got = {}
            for v in ("a", "b"):
                n = 8 + seed % 2  # 8 or 9 steps: quarters of 2
                r = rng.normal(-3, 1, n) + np.linspace(0, rng.uniform(0, 4), n)
                v0, v1 = 0.5, float(rng.choice([0.5, 0.625, 0.75]))
                t1 = 0.8 + float(rng.choice([-0.01, 0.0, 0.02]))
                _check_run(tmp_path / root / v / f"seed{seed}", r.tolist(), (v0, v1),
                           (0.8, t1), "t")
                q = len(r) // 4
                got[v] = np.array([len(r), r[-q:].mean() - r[:q].mean(), v1 - v0, t1 - 0.8])
            diffs.append(got["a"] - got["b"])
    _check_run(tmp_path / "s2" / "a" / "seed9", [-1.0, 0.0], (0.5, 0.5), (0.8, 0.8), "t")
    studies = {k: st.load_study(tmp_path / k) for k in ("s1", "s2")}
    rows = st.paired_differences(studies, "a", "b")
    assert [(r["study"], r["seed"]) for r in rows] == [("s1", 0), ("s1", 1), ("s1", 2),
                                                       ("s2", 5), ("s2", 6)]
    diffs = np.array(diffs)
    np.testing.assert_allclose([[r[k] for k in st.PAIRED_KEYS] for r in rows], diffs,
                               atol=1e-12)
    table = st.paired_table(studies, "a", "b")
    m, se = diffs.mean(0), diffs.std(0, ddof=1) / np.sqrt(len(diffs))
    assert (f"| **all** | 5 pairs | {m[0]:+.1f} ± {se[0]:.1f} ({(diffs[:, 0] > 0).sum()} > 0, "
            f"{(diffs[:, 0] < 0).sum()} < 0) | {m[1]:+.2f} ± {se[1]:.2f} ("
            f"{(diffs[:, 1] > 0).sum()} > 0, {(diffs[:, 1] < 0).sum()} < 0) |") in table, table
    assert f"| s2 | 6 | {diffs[4, 0]:+.1f} | {diffs[4, 1]:+.2f} | {diffs[4, 2]:+.3f} |" in table


def test_valid_gain_standard_error_pairs_the_candidates_by_draw(tmp_path):
    """Candidate i of both evaluations is one draw: the change's standard error is the sample
    std of the N per-draw differences over sqrt(N), against NumPy; none for unpaired lists."""
    rng = np.random.default_rng(11)
    kinds = ["solve"] * 16 + ["improve"] * 16
    ses = []
    for seed in (0, 1):
        before = rng.random(32) < 0.6
        after = before | (rng.random(32) < 0.4)
        after[3] = False

        def ev(valid, rate):
            return {"n": 32, "direction": "higher", "valid_rate": rate, "candidates": [
                {"kind": k, "reward_split": {"status": "valid" if v else "failure"}}
                for k, v in zip(kinds, valid)]}
        wd = tmp_path / "v" / f"seed{seed}"
        _write_run(wd, [-3.0, 0.0], [60.0, 120.0], final=ev(after, after.mean()))
        (wd / "eval_initial.json").write_text(json.dumps(ev(before, before.mean())))
        d = after.astype(float) - before.astype(float)
        ses.append(np.std(d, ddof=1) / np.sqrt(32))
    runs = st.load_study(tmp_path)["v"]
    for r, se in zip(runs, ses):
        c = st.learning_check(r)
        np.testing.assert_allclose(c["valid_gain_se"], se)
        assert f"| {c['valid_gain']:+.3f} ± {se:.3f} |" in st.learning_table({"v": [r]})
    table = st.learning_table({"v": runs})
    gain = np.mean([st.learning_check(r)["valid_gain"] for r in runs])
    assert f"| {gain:+.3f} ± {np.sqrt(ses[0] ** 2 + ses[1] ** 2) / 2:.3f} |" in table, table
    ini, fin = runs[0].initial, runs[0].final
    assert st.valid_gain_se(ini, {**fin, "candidates": fin["candidates"][:31]}) is None
    swapped = [dict(c, kind="improve" if c["kind"] == "solve" else "solve")
               for c in fin["candidates"]]
    assert st.valid_gain_se(ini, {**fin, "candidates": swapped}) is None
    assert st.valid_gain_se({}, fin) is None
