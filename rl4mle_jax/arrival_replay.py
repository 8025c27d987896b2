"""A run's arrival bias, replayed from its experience log: which episodes started, which were
trained, per Δt bucket, and the p̂ that duration weighting "inverse_inclusion" divides by.

Reads only the workdir's files (`study.load_run`), so any finished or interrupted run can be
redrawn; report.md and scripts/bench_admission.py use it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from rl4mle_jax.rl.arrival import ArrivalModel
from rl4mle_jax.rollout.collate import DURATION_FLOOR_S, episode_durations
from rl4mle_jax.study import Run


def arrival_events(run: Run) -> list[tuple[str, float]]:
    """How each started episode of the experience log ended, with its Δt in seconds, as the
    loop's live `ArrivalModel` saw it: ("trained" | "dropped", Δt) for a finished one (Δt from
    the run's `run.duration_source` and floor, as the loop measures it; trained = `selected`),
    ("failed", elapsed) for one that raised, ("censored", elapsed) for one still running when
    the run stopped (`cancelled`: not lost, its Δt is longer)."""
    cfg = (run.config or {}).get("run", {})
    source = cfg.get("duration_source", "episode")
    floor_s = cfg.get("duration_floor_s", DURATION_FLOOR_S)
    events = []
    for e in run.episodes:
        if e.get("cancelled"):
            events.append(("censored", max(float(e["elapsed_s"]), 0.0)))
        elif e.get("error") is not None:
            events.append(("failed", max(float(e["elapsed_s"]), 0.0)))
        else:
            timing = SimpleNamespace(started_at=e.get("started_at"),
                                     finished_at=e.get("finished_at"),
                                     duration_s=e.get("duration_s"))
            dt = float(episode_durations([timing], source, floor_s)[0])
            events.append(("trained" if e.get("selected") else "dropped", dt))
    return events


def arrival_model(run: Run) -> ArrivalModel:
    """The run's `rl.arrival.ArrivalModel` rebuilt by replaying its experience log
    (`arrival_events`), so a report shows the p̂ that learner.duration_weighting=
    "inverse_inclusion" divides by, from any finished or interrupted workdir. Episodes in
    flight when a resumed run's checkpoint was written have no log line; the live model
    censors them, which changes only the censored counts."""
    model = ArrivalModel()
    for i, (kind, dt) in enumerate(arrival_events(run)):  # own ids: a resume may reuse one
        model.started(i, 0.0)
        if kind == "censored":
            model.cancelled(i, dt, at_shutdown=True)
        else:
            model.finished(i, dt, trained=kind == "trained")
    return model


def arrival_bias(run: Run) -> dict[str, Any]:
    """Started vs trained episodes per Δt bucket, their ratio and the smoothed p̂ (the rows of
    `ArrivalModel.table` for the replayed log, from the first to the last bucket with an
    episode), and the slope of log(trained / started) against log Δt.

    DAG's premise (inclusion ∝ 1/Δt, the paper's arrival process) is a slope of -1, where
    `batch_mean` weights are exact; nothing lost is a slope of 0, where they over-correct and
    inverse_inclusion weights are 1. The slope is a weighted least-squares fit (weights: the
    bucket's started count) over the buckets with >= 3 started and >= 1 trained, at each
    bucket's mean Δt.
    """
    model = arrival_model(run)
    rows = model.table()
    seen = [i for i, r in enumerate(rows)
            if r["trained"] + r["dropped"] + r["cancelled"] + r["censored"] > 0]
    buckets = rows[seen[0]:seen[-1] + 1] if seen else []
    use = [b for b in buckets if b["started"] >= 3 and b["trained"] > 0]
    slope = None
    if len(use) >= 2:
        x, y = np.log([b["at_s"] for b in use]), np.log([b["rate"] for b in use])
        w = np.asarray([b["started"] for b in use], float)
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        var = np.average((x - xm) ** 2, weights=w)
        slope = float(np.average((x - xm) * (y - ym), weights=w) / var) if var > 0 else None
    cfg = (run.config or {}).get("run", {})
    return {"buckets": buckets, "slope": slope, "started": model.num_started,
            "trained": int(model.trained.sum()), "dropped": int(model.dropped.sum()),
            "censored": int(model.censored.sum()),
            "duration_source": cfg.get("duration_source", "episode")}
