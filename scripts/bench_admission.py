"""Admission control vs drop-stale on the real loop: slot use, learner throughput, trained Δt.

    python scripts/bench_admission.py --workdir /tmp/bench_admission --budget_s 600 \
        [--slots 4 --batch_size 2 --max_staleness 1] [--seeds 0] [--task food-reviews] \
        [--set run.eval_samples=2 --set learner.duration_weighting=off ...]

Each mode is one `rl4mle_jax.train.train` run of configs/task.py with run.admission = MODE,
the same task, seed and settings otherwise, in WORKDIR/<mode>/seed<k> (a study directory that
rl4mle_jax.study reads); a finished run (eval_final.json) is skipped and an interrupted one
resumes, so the command can be re-run until the table is complete (--only_table: just the
table). Both modes share each seed's initial best-of-N (WORKDIR/_initial_evals).

Why slots > batch and a small max_staleness: staleness needs episodes that span updates. With
K slots and batches of B < K, a slow episode sees several updates while fast ones refill the
batch; "drop_stale" then discards it once it is more than max_staleness versions old (and starts
freely: full slots, a batch tilted to fast episodes), while "bounded" keeps every finisher but
starts an episode only while started-but-untrained < (max_staleness + 1) × B (idle slots).

Per mode (mean over seeds), from the runs' own files: slot utilisation and the share of
slot-time spent waiting for admission (the last metrics row's `slots/*`); learner throughput
(steps and trained episodes per minute between the first and the last learner step, so the
first compile is left out); the loop's episode counts (`episodes/*`: started, trained, dropped
for staleness, trained although older than max_staleness); the Δt of the trained episodes
(those the log marks `selected`, accepted for training; quantiles; Δt as the loop measures it,
run.duration_source) against the mean Δt of all started ones (still-running ones at their
elapsed time: a lower bound), the mean staleness of the trained, and the arrival slope of
report.md (log trained/started against log Δt; -1 is DAG's premise, 0 nothing lost). The last
column is bounded / drop_stale. The table also goes to WORKDIR/results.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl4mle_jax import arrival_replay  # noqa: E402
from rl4mle_jax import study as st  # noqa: E402

MODES = ("bounded", "drop_stale")  # run.admission
ROWS = (  # (key, label, format)
    ("utilisation", "slot utilisation", ".3f"),
    ("admission_idle_frac", "slot-time waiting for admission", ".3f"),
    ("rl_wall_s", "RL wall-clock at the last step (s)", ".0f"),
    ("steps", "learner steps", ".0f"),
    ("steps_per_min", "learner steps / min (first to last step)", ".2f"),
    ("trained_per_min", "trained episodes / min (first to last step)", ".2f"),
    ("started", "episodes started", ".0f"),
    ("trained", "episodes trained", ".0f"),
    ("dropped", "episodes dropped (stale)", ".0f"),
    ("over_staleness", "trained although > max_staleness", ".0f"),
    ("failed", "episodes failed", ".0f"),
    ("staleness_trained", "mean staleness of the trained (versions)", ".2f"),
    ("dt_started_mean", "mean Δt started (s, >=)", ".2f"),
    ("dt_trained_mean", "mean Δt trained (s)", ".2f"),
    ("dt_trained_p10", "Δt trained p10 (s)", ".2f"),
    ("dt_trained_p50", "Δt trained p50 (s)", ".2f"),
    ("dt_trained_p90", "Δt trained p90 (s)", ".2f"),
    ("dt_trained_max", "Δt trained max (s)", ".2f"),
    ("arrival_slope", "arrival slope (premise -1, nothing lost 0)", "+.2f"),
)


def _parse_sets(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE (flattened config keys) with the value parsed as JSON when it can be."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare string, e.g. learner.duration_weighting=off
    return out


def run_config(args: argparse.Namespace, mode: str, seed: int) -> Any:
    """configs/task.py with the benchmark's overrides: only run.admission differs by mode."""
    from configs.task import get_config

    cfg = get_config(args.task)
    cfg.update_from_flattened_dict({
        "run.admission": mode, "run.slots": args.slots, "run.batch_size": args.batch_size,
        "run.max_staleness": args.max_staleness, "run.time_budget_s": float(args.budget_s),
        "run.eval_samples": args.eval_samples, "run.progress": False,
        **_parse_sets(args.set)})
    cfg.seed = int(seed)
    return cfg


def measure(run: st.Run) -> dict[str, float | None]:
    """The table's numbers for one run, from its metrics.jsonl and experience.jsonl."""
    rows = [r for r in run.metrics if "episodes/trained" in r]
    out: dict[str, float | None] = dict.fromkeys(k for k, _, _ in ROWS)
    if rows:
        first, last = rows[0], rows[-1]
        span_min = (last["wall_s"] - first["wall_s"]) / 60
        out.update(utilisation=last.get("slots/utilisation"),
                   admission_idle_frac=last.get("slots/admission_idle_frac"),
                   rl_wall_s=last["wall_s"], steps=last["step"],
                   started=last.get("episodes/started"), trained=last["episodes/trained"],
                   dropped=last.get("episodes/dropped"),
                   over_staleness=last.get("episodes/over_staleness"),
                   failed=last.get("episodes/failed"))
        if span_min > 0:
            out["steps_per_min"] = (last["step"] - first["step"]) / span_min
            out["trained_per_min"] = (last["episodes/trained"]
                                      - first["episodes/trained"]) / span_min
    events = arrival_replay.arrival_events(run)
    trained = np.asarray([dt for kind, dt in events if kind == "trained"])
    if len(events):
        out["dt_started_mean"] = float(np.mean([dt for _, dt in events]))
    if len(trained):
        out.update(dt_trained_mean=float(trained.mean()), dt_trained_max=float(trained.max()),
                   **{f"dt_trained_p{q}": float(np.percentile(trained, q))
                      for q in (10, 50, 90)})
    stale = [e["staleness"] for e in run.episodes if e.get("selected") and "staleness" in e]
    out["staleness_trained"] = float(np.mean(stale)) if stale else None
    out["arrival_slope"] = arrival_replay.arrival_bias(run)["slope"]
    return out


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(xs)) if xs else None


def table(root: Path, seeds: list[int], header: str) -> str:
    """Markdown: one row per measure, one column per mode (mean over seeds), and the ratio."""
    study = st.load_study(root)
    per_mode = {}
    for mode in MODES:
        runs = [r for r in study.get(mode, []) if r.seed in seeds]
        ms = [measure(r) for r in runs]
        per_mode[mode] = ({k: _mean([m[k] for m in ms]) for k, _, _ in ROWS}, len(runs))
    (a, na), (d, nd) = per_mode["bounded"], per_mode["drop_stale"]
    lines = [header, "", f"| measure | bounded (admission, {na} seeds) | drop_stale "
             f"({nd} seeds) | bounded / drop_stale |", "|---|---|---|---|"]
    for key, label, fmt in ROWS:
        def cell(x, fmt=fmt):
            return "—" if x is None else format(x, fmt)
        ratio = (a[key] / d[key] if a[key] is not None and d[key] not in (None, 0)
                 and key != "arrival_slope" else None)
        lines.append(f"| {label} | {cell(a[key])} | {cell(d[key])} | {cell(ratio, '.2f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="one workdir per mode and seed")
    ap.add_argument("--budget_s", type=float, default=600.0, help="RL wall-clock per run")
    ap.add_argument("--slots", type=int, default=4, help="run.slots (concurrent episodes)")
    ap.add_argument("--batch_size", type=int, default=2, help="run.batch_size (< slots)")
    ap.add_argument("--max_staleness", type=int, default=1, help="run.max_staleness")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--task", default="food-reviews")
    ap.add_argument("--eval_samples", type=int, default=2,
                    help="best-of-N before and after RL (not what is measured: kept small)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other config override, e.g. learner.duration_weighting=off")
    ap.add_argument("--only_table", action="store_true", help="draw from existing runs only")
    args = ap.parse_args(argv)
    if args.slots <= args.batch_size:
        ap.error(f"--slots ({args.slots}) must exceed --batch_size ({args.batch_size}): "
                 f"staleness needs episodes that span updates")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("rl4mle_jax").setLevel(logging.INFO)
    if not args.only_table:
        from rl4mle_jax.train import train

        for seed in args.seeds:
            for mode in MODES:
                workdir = args.workdir / mode / f"seed{seed}"
                if (workdir / "eval_final.json").exists():
                    continue
                train(run_config(args, mode, seed), workdir,
                      shared_evals=args.workdir / "_initial_evals")
    command = st.run_command("scripts/bench_admission.py", sys.argv[1:] if argv is None
                             else argv, drop=("--only_table",))
    header = (f"# Admission control vs drop-stale\n\nCommand: `{command}`  \nRuns made at "
              f"{', '.join(sorted(st.run_commits(st.load_study(args.workdir)))) or 'unknown'}"
              f"; task {args.task}, slots {args.slots}, batch {args.batch_size}, max_staleness "
              f"{args.max_staleness}, {args.budget_s:.0f} s RL per run, seeds {args.seeds}.")
    text = table(args.workdir, args.seeds, header)
    (args.workdir / "results.md").write_text(text + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
