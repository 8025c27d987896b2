"""Metric logger writes JSONL + TensorBoard; plots read the whole file, torn lines skipped."""

from rl4mle_jax.tracking import MetricLogger, plot_metrics, read_metrics


def test_metrics_jsonl_tensorboard_and_plots(tmp_path):
    logger = MetricLogger(tmp_path)
    for step in range(3):
        logger.write(step, wall_s=10.0 * step, scalars={
            "reward/mean": -10 + step, "slots/utilisation": 0.5,
            "note": "skipped", "nan": float("nan")})
    logger.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "wal')  # torn by a crash
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2] == {"step": 2, "wall_s": 20.0, "reward/mean": -8.0, "slots/utilisation": 0.5}
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    pngs = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert {p.name for p in pngs} >= {"reward.png", "utilisation.png", "best_score.png"}
    assert all(p.stat().st_size > 1000 for p in pngs)


def test_resume_drops_rows_past_the_checkpoint(tmp_path):
    logger = MetricLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.write(step, wall_s=step, scalars={"reward/mean": step})
    logger.close()
    logger = MetricLogger(tmp_path, tensorboard=False, resume_step=2)
    logger.write(3, wall_s=3.5, scalars={"reward/mean": 30})
    logger.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 1), (2, 2), (3, 30)]


def test_older_metric_keys_are_read_under_todays_names(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "wall_s": 1.0, "duration/mean": 2.5, "duration_mean": 4.0, '
        '"duration/episode_mean": 4.0}\n')
    logger = MetricLogger(tmp_path, tensorboard=False, resume_step=1)
    logger.write(2, wall_s=2.0, scalars={"duration_s/mean": 3.0, "dt_s/mean": 5.0})
    logger.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["duration_s/mean"] for r in rows] == [2.5, 3.0]
    assert [r["dt_s/mean"] for r in rows] == [4.0, 5.0]
    assert rows[0]["episode_wall_s/mean"] == 4.0
