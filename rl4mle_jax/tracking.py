"""Metrics: an append-only JSONL of scalars, TensorBoard, and PNG plots against wall-clock.

The JSONL file is the source of truth: plots are drawn from it, not from memory, so a run
resumed after a crash plots its whole history.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Plots the training report shows: (file stem, title, metric keys drawn on that plot).
DEFAULT_PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "Mean reward", ("reward/mean",)),
    ("best_score", "Best score (reward split)", ("score/best",)),
    ("duration", "Mean sandbox time of the programs, duration_s (s)", ("duration_s/mean",)),
    ("milestones", "Milestone rates", (
        "milestones/libraries_imported", "milestones/data_loaded", "milestones/model_defined",
        "milestones/model_trained", "milestones/predictions_made",
        "milestones/submission_written")),
    ("instrumentation", "LM instrumentation acceptance", ("instrument/accept_rate",)),
    ("utilisation", "Sandbox slot utilisation", ("slots/utilisation", "slots/sync_utilisation")),
)


# Metric keys of older runs -> today's (read_metrics renames them, so a run resumed from an
# older metrics.jsonl plots one history): sandbox time, the weights' Δt, episode wall-clock.
RENAMED_METRICS = {"duration/mean": "duration_s/mean", "duration_mean": "dt_s/mean",
                   "duration/episode_mean": "episode_wall_s/mean"}


class MetricLogger:
    """Writes scalars to `<workdir>/metrics.jsonl` and TensorBoard (`<workdir>/tb`)."""

    def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True,
                 resume_step: int | None = None):
        """resume_step: drop rows past this step (a run resumed from that checkpoint redoes
        them), so the file, and the plots drawn from it, show one consistent history."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            rows = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.replace(tmp, self.path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.workdir / "tb"))

    def write(self, step: int, wall_s: float, scalars: Mapping[str, Any]) -> None:
        clean = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        self._fh.write(json.dumps({"step": int(step), "wall_s": float(wall_s), **clean}) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            for key, value in clean.items():
                self._tb.add_scalar(key, value, global_step=int(step), walltime=None)
            self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def _is_number(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def read_metrics(path: str | os.PathLike) -> list[dict[str, float]]:
    """Complete records of a metrics file; a torn last line (crash mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append({RENAMED_METRICS.get(k, k): v for k, v in row.items()})
    return rows


def plot_metrics(
    metrics_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    plots: Sequence[tuple[str, str, Sequence[str]]] = DEFAULT_PLOTS,
) -> list[Path]:
    """One PNG per plot, each metric against wall-clock minutes; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, title, keys in plots:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            points = [(r["wall_s"] / 60, r[key]) for r in rows if key in r]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker=".", label=key.split("/", 1)[-1])
        ax.set_title(title)
        ax.set_xlabel("wall-clock (min)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
