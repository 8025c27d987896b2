"""A study of several variants × seeds: its learning curves, Δt over time and ablation table.

A study is a directory `<root>/<variant>/seed<k>/` of ordinary run workdirs (what
`experiments/sweep.py` writes). Everything here reads the workdirs' own files, so any finished
or interrupted run can be redrawn:

  metrics.jsonl      one row per learner step (reward/mean, wall_s, ...)
  experience.jsonl   one row per started episode (reward record, duration_s, selected, ...;
                     failed and still-running-at-the-end ones too)
  config.json        the run's config
  eval_initial.json / eval_final.json   best-of-N before and after RL

Figures follow the paper's: learning curves with across-seed bands (Fig. 7), the mean Δt of the
trained episodes over time per variant (Fig. 8), reward with and without instrumentation
(Fig. 9).
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.tracking import read_metrics


@dataclass
class Run:
    variant: str
    seed: int
    workdir: Path
    metrics: list[dict[str, float]] = field(default_factory=list)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    initial: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    config: dict[str, Any] | None = None  # config.json: which Δt the loop measured


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash: the rest is still good
            continue
    return rows


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def load_run(workdir: str | Path, variant: str = "run", seed: int = 0) -> Run:
    wd = Path(workdir)
    metrics = read_metrics(wd / "metrics.jsonl") if (wd / "metrics.jsonl").exists() else []
    return Run(variant, seed, wd, metrics, _read_jsonl(wd / "experience.jsonl"),
               _read_json(wd / "eval_initial.json"), _read_json(wd / "eval_final.json"),
               _read_json(wd / "config.json"))


def load_study(root: str | Path) -> dict[str, list[Run]]:
    """{variant: [runs by seed]} from `<root>/<variant>/seed<k>/` (a bare workdir: one run)."""
    root = Path(root)
    if (root / "metrics.jsonl").exists():
        return {"run": [load_run(root)]}
    out: dict[str, list[Run]] = {}
    for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
        dirs = sorted((s for s in vdir.glob("seed*") if s.name[4:].isdigit()),
                      key=lambda s: int(s.name[4:]))  # seed8, seed9, seed10: by number
        runs = [load_run(s, vdir.name, int(s.name[4:])) for s in dirs]
        if runs:
            out[vdir.name] = runs
    return out


@functools.lru_cache(maxsize=8)
def git_commit(cwd: str | Path | None = None) -> str:
    """The short commit of the checkout (with "+dirty" when tracked files changed), for
    provenance of a table or figure: read once per process, so a long study records the
    code it started with even when the checkout moves on while it runs."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=cwd).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------- curves
def curve(run: Run, key: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(wall-clock minutes, values) of one metric over learner steps; smooth > 1: each value is
    the mean of the last `smooth` steps' (fewer at the start)."""
    rows = [r for r in run.metrics if key in r and math.isfinite(r[key])]
    t, v = np.asarray([r["wall_s"] / 60 for r in rows]), np.asarray([r[key] for r in rows])
    if smooth > 1 and len(v):
        c = np.cumsum(np.concatenate([[0.0], v]))
        idx = np.arange(1, len(v) + 1)
        lo = np.maximum(idx - smooth, 0)
        v = (c[idx] - c[lo]) / (idx - lo)
    return t, v


def trained_dt_curve(run: Run, window: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(minutes, mean duration_s of the trained episodes in a sliding window of `window`), in
    the order the episodes finished (the log's order is not: rows are written as episodes are
    trained, and a batch holds episodes that finished out of order)."""
    eps = sorted((e for e in run.episodes if e.get("selected") and "duration_s" in e
                  and e.get("wall_s") is not None), key=lambda e: e["wall_s"])
    if not eps:
        return np.zeros(0), np.zeros(0)
    t = np.asarray([e["wall_s"] / 60 for e in eps])
    dt = np.asarray([float(e["duration_s"]) for e in eps])
    kernel = np.ones(min(window, len(dt))) / min(window, len(dt))
    return t[len(kernel) - 1:], np.convolve(dt, kernel, mode="valid")


def band(runs: list[Run], key: str, grid_points: int = 50, smooth: int = 1
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, std) across seeds of a metric (each run's `curve(..., smooth)`), each run
    held at its last value (step function) on a common wall-clock grid up to the shortest
    run's end."""
    return grid_band([curve(r, key, smooth) for r in runs], grid_points)


def grid_band(curves: list[tuple[np.ndarray, np.ndarray]], grid_points: int = 50
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, std) of (t, value) curves, each held at its last value on a common grid
    from the latest start to the earliest end (`band`'s rule for any curve)."""
    curves = [c for c in curves if len(c[0])]
    if not curves:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    end = min(c[0][-1] for c in curves)
    start = max(c[0][0] for c in curves)
    grid = np.linspace(start, max(end, start), grid_points)
    vals = np.stack([c[1][np.clip(np.searchsorted(c[0], grid, side="right") - 1, 0, None)]
                     for c in curves])
    return grid, vals.mean(axis=0), vals.std(axis=0)


def plot_bands(study: dict[str, list[Run]], key: str = "reward/mean", ax: Any = None,
               variants: list[str] | None = None, title: str | None = None, smooth: int = 1
               ) -> Any:
    """Mean ± std across seeds of `key` (moving mean over `smooth` steps) against wall-clock,
    one band per variant."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    for i, variant in enumerate(variants or list(study)):
        grid, mean, std = band(study[variant], key, smooth=smooth)
        if not len(grid):
            continue
        ax.plot(grid, mean, color=f"C{i}", label=f"{variant} (n={len(study[variant])})")
        ax.fill_between(grid, mean - std, mean + std, color=f"C{i}", alpha=0.2)
    ax.set_xlabel("wall-clock (min)")
    ax.set_title(title or key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_trained_dt(study: dict[str, list[Run]], ax: Any = None) -> Any:
    """Mean Δt (duration_s) of the trained episodes over time (`trained_dt_curve`), mean ± std
    across seeds per variant (`grid_band`)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4))[1]
    for i, (variant, runs) in enumerate(study.items()):
        grid, mean, std = grid_band([trained_dt_curve(r) for r in runs])
        if not len(grid):
            continue
        ax.plot(grid, mean, color=f"C{i}", label=f"{variant} (n={len(runs)})")
        ax.fill_between(grid, mean - std, mean + std, color=f"C{i}", alpha=0.2)
    ax.set_xlabel("wall-clock (min)")
    ax.set_ylabel("mean duration_s of trained episodes (s)")
    ax.set_title("Δt of the trained episodes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


# ---------------------------------------------------------------- table
# Fewest replicates (finite in both) for a paired standard error.
MIN_PAIRED_REPLICATES = 16


def paired_se(boot_a: list[float] | None, boot_b: list[float] | None) -> float | None:
    """Standard error of score b − score a from the grader's replicates of both on the same
    resamples (`env.grading.GradeReport.score_boot`): the sample std of their differences.
    None when either is missing, they differ in length, or fewer than MIN_PAIRED_REPLICATES
    are finite in both. Orientation does not matter (a sign flip keeps the std)."""
    if not boot_a or not boot_b or len(boot_a) != len(boot_b):
        return None
    d = np.asarray(boot_b, np.float64) - np.asarray(boot_a, np.float64)
    d = d[np.isfinite(d)]
    return float(np.std(d, ddof=1)) if d.size >= MIN_PAIRED_REPLICATES else None


def valid_gain_se(initial: dict[str, Any], final: dict[str, Any]) -> float | None:
    """Standard error of the best-of-N valid-rate change, pairing the two evaluations'
    candidates by draw (the same keys: candidate i of both): the sample std of the N
    differences valid_final_i − valid_initial_i (each 1, 0 or −1) over sqrt(N). Valid is the
    reward rules' `status == "valid"` on the reward split (best_of_n.valid_score). It is
    conditional on each evaluation's improve parent (one program per evaluation, drawn from
    its own solve half), whose own luck it leaves out. None without two equally long candidate
    lists of the same kinds in the same order (an older or multi-task record), or below 2."""
    a, b = initial.get("candidates") or [], final.get("candidates") or []
    if len(a) < 2 or len(a) != len(b) or [c.get("kind") for c in a] != [
            c.get("kind") for c in b]:
        return None

    def ok(c: dict[str, Any]) -> float:
        return float((c.get("reward_split") or {}).get("status") == "valid")

    d = np.array([ok(y) - ok(x) for x, y in zip(a, b)])
    return float(np.std(d, ddof=1) / np.sqrt(d.size))


def mean_se(ses: list[float | None]) -> float | None:
    """Standard error of a mean over independent runs from each run's own: the root of the
    summed variances over the count (None when any run lacks one, or there are none)."""
    if not ses or any(x is None for x in ses):
        return None
    return float(np.sqrt(np.sum(np.square(ses)))) / len(ses)


def _pick(ev: dict[str, Any] | None, key: str) -> Any:
    return None if not ev else (ev.get("pick") or {}).get(key)


def time_to_first_valid(run: Run) -> float | None:
    """Wall-clock seconds of the first episode whose reward record is valid."""
    times = [e.get("wall_s") for e in run.episodes
             if (e.get("record") or {}).get("status") == "valid" and e.get("wall_s") is not None]
    return min(times) if times else None


def summary_row(runs: list[Run]) -> dict[str, tuple[float | None, float | None, int]]:
    """Per column: (mean, std, n) over the seeds that have a value."""
    def stat(xs):
        xs = [float(x) for x in xs if x is not None]
        return (float(np.mean(xs)), float(np.std(xs)), len(xs)) if xs else (None, None, 0)

    return {
        "final pick: reward split": stat(_pick(r.final, "reward_score") for r in runs),
        "final pick: test split": stat(_pick(r.final, "test_score") for r in runs),
        "final valid rate": stat((r.final or {}).get("valid_rate") for r in runs),
        "initial valid rate": stat((r.initial or {}).get("valid_rate") for r in runs),
        "learner steps": stat((r.metrics[-1]["step"] if r.metrics else None) for r in runs),
        "time to first valid (s)": stat(time_to_first_valid(r) for r in runs),
    }


def ablation_table(study: dict[str, list[Run]]) -> str:
    """Markdown: one row per variant, mean ± std over seeds for each column."""
    rows = {v: summary_row(runs) for v, runs in study.items()}
    cols = list(next(iter(rows.values()))) if rows else []
    lines = ["| variant | seeds | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for variant, row in rows.items():
        cells = ["—" if m is None else f"{m:.4g} ± {s:.2g}" for m, s, _ in row.values()]
        lines.append(f"| {variant} | {len(study[variant])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the learner's compiles
# Per run, from the metrics the loop logs per step (train._Trainer._learn): where the train
# step's compiles went (inside a step, ahead on their own thread, declined by
# run.precompile_payback) and what they cost the steps.
COMPILE_COLS = ("steps", "compiled in a step", "padded to a compiled shape", "compiled ahead",
                "declined", "compile-ahead wait (s)", "train steps (s)", "median step (s)")


def compile_stats(run: Run) -> dict[str, float | None]:
    """COMPILE_COLS for one run (None where its metrics lack the key: older runs). Compiled
    ahead counts the warm-up's shapes too (compiled before the RL clock starts); the median
    step is over steps without a compile inside."""
    rows = run.metrics

    def total(key: str) -> float | None:
        xs = [r[key] for r in rows if key in r]
        return float(np.sum(xs)) if xs else None

    def last(key: str) -> float | None:
        xs = [r[key] for r in rows if key in r]
        return float(xs[-1]) if xs else None

    plain = [r["time/train_step_s"] for r in rows
             if "time/train_step_s" in r and not r.get("learner/compiled_in_step")]
    return dict(zip(COMPILE_COLS, (
        float(rows[-1]["step"]) if rows else None, total("learner/compiled_in_step"),
        total("learner/padded_to_compiled"), last("learner/compiled_ahead"),
        last("learner/compile_ahead_declined"), total("time/compile_ahead_wait_s"),
        total("time/train_step_s"), float(np.median(plain)) if plain else None)))


def _fmt4(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def compile_table(study: dict[str, list[Run]]) -> str:
    """Markdown: `compile_stats` per run, then each variant's mean over its seeds."""
    lines = ["| variant | seed | " + " | ".join(COMPILE_COLS) + " |",
             "|---|---|" + "---|" * len(COMPILE_COLS)]
    means = []
    for variant, runs in study.items():
        stats = [compile_stats(r) for r in runs]
        for r, c in zip(runs, stats):
            lines.append(f"| {variant} | {r.seed} | "
                         + " | ".join(_fmt4(c[k]) for k in COMPILE_COLS) + " |")
        means.append(f"| {variant} | mean of {len(runs)} | " + " | ".join(
            _fmt4(_mean([c[k] for c in stats])) for k in COMPILE_COLS) + " |")
    return "\n".join(lines + means)


# ---------------------------------------------------------------- did it learn?
# The checks of issue 11 (point 3), per run; averaged over seeds by `learning_table`.
LEARNING_GOALS = {"reward_gain": 2.0, "valid_gain": 0.25, "test_gain": 0.0}


def learning_check(run: Run) -> dict[str, Any]:
    """First vs last quarter of the learner steps' batch reward, and best-of-N before vs after.

    reward_first / reward_last: mean `reward/mean` over the first / last max(1, steps // 4)
    learner steps; reward_gain_se: the standard error of their difference from the spread of
    the batch means within each quarter (sqrt(var_first / q + var_last / q), sample variances;
    None below 2 steps a quarter). It treats the batches as independent draws, which they are
    not quite (the policy moves between them): it measures how much of one run's gain the
    batch noise alone could make, the noise that 8 episodes with rewards of -10 or ~+1 carry;
    valid_*: best-of-N valid rate (same draws before and after); test_*: the
    test-split score of the pick (made by `pick_rule`, best_of_n.select_pick, on the reward and
    selection splits), and test_gain its change oriented so that > 0 is better (None when either
    pick is missing); test_gain_se its standard error on the test split (`paired_se` of the two
    picks' replicates; None for evaluations without them); test_max_*: the same for the reward
    split's maximum (the "max" rule) where the pick was made by another rule.
    """
    rewards = [r["reward/mean"] for r in run.metrics
               if "reward/mean" in r and math.isfinite(r["reward/mean"])]
    q = max(1, len(rewards) // 4)
    out: dict[str, Any] = {"variant": run.variant, "seed": run.seed, "steps": len(rewards)}
    out["reward_first"] = float(np.mean(rewards[:q])) if rewards else None
    out["reward_last"] = float(np.mean(rewards[-q:])) if rewards else None
    out["reward_gain"] = (out["reward_last"] - out["reward_first"]) if rewards else None
    out["reward_gain_se"] = (float(np.sqrt((np.var(rewards[:q], ddof=1)
                                            + np.var(rewards[-q:], ddof=1)) / q))
                             if q >= 2 else None)
    ini, fin = run.initial or {}, run.final or {}
    out["eval_n"] = fin.get("n", ini.get("n"))
    out["valid_initial"], out["valid_final"] = ini.get("valid_rate"), fin.get("valid_rate")
    out["valid_gain"] = (None if None in (out["valid_initial"], out["valid_final"])
                         else out["valid_final"] - out["valid_initial"])
    out["valid_gain_se"] = valid_gain_se(ini, fin) if out["valid_gain"] is not None else None
    direction = fin.get("direction") or ini.get("direction") or "higher"
    out["pick_rule"] = _pick(fin, "rule") or "max"
    for name, key in (("test", "pick"), ("test_max", "pick_max")):
        if key == "pick_max" and out["pick_rule"] == "max":
            continue
        p0, p1 = ini.get(key) or {}, fin.get(key) or {}
        t0, t1 = p0.get("test_score"), p1.get("test_score")
        out[f"{name}_initial"], out[f"{name}_final"] = t0, t1
        out[f"{name}_gain"] = (None if t0 is None or t1 is None
                               else oriented_score(t1, direction) - oriented_score(t0, direction))
        out[f"{name}_gain_se"] = paired_se(p0.get("test_score_boot"), p1.get("test_score_boot"))
    out["by_kind"] = valid_by_kind(run)
    return out


PROMPT_KINDS = ("solve", "improve")


def trained_episodes(run: Run) -> list[dict[str, Any]]:
    """The episodes the learner trained on, with their reward records, in the log's order."""
    return [e for e in run.episodes if e.get("record") and not e.get("cancelled")
            and e.get("selected", True)]


def valid_share(episodes: list[dict[str, Any]]) -> float | None:
    """Share of `episodes` whose record is valid (None for none)."""
    ok = [e["record"].get("status") == "valid" for e in episodes]
    return sum(ok) / len(ok) if ok else None


def valid_by_kind(run: Run) -> dict[str, dict[str, float | None]]:
    """Where the valid rate moved, per prompt kind: best-of-N before vs after (`eval_initial`,
    `eval_final`) and the trained episodes of the first vs last quarter, in the order they were
    logged (`train_first`, `train_last`). None where a kind has no sample."""
    trained = trained_episodes(run)
    q = max(1, len(trained) // 4)

    def rate(episodes: list[dict[str, Any]], kind: str) -> float | None:
        return valid_share([e for e in episodes if e.get("kind") == kind])

    def eval_rate(ev: dict[str, Any] | None, kind: str) -> float | None:
        k = ((ev or {}).get("by_kind") or {}).get(kind) or {}
        return k["valid"] / k["n"] if k.get("n") else None

    return {kind: {"eval_initial": eval_rate(run.initial, kind),
                   "eval_final": eval_rate(run.final, kind),
                   "train_first": rate(trained[:q], kind),
                   "train_last": rate(trained[-q:], kind)}
            for kind in PROMPT_KINDS}


def parent_cut(run: Run) -> dict[str, float | int | None] | None:
    """Trained improve episodes whose prompt left out lines of the parent program to fit the
    prompt budget (`parent_lines_omitted`): how many, and the valid rate with the parent cut and
    whole. None for logs without the field (before it was recorded) or without improve rows."""
    rows = [e for e in trained_episodes(run)
            if e.get("kind") == "improve" and e.get("parent_lines_omitted") is not None]
    if not rows:
        return None
    cut = [e for e in rows if e["parent_lines_omitted"] > 0]
    whole = [e for e in rows if e["parent_lines_omitted"] == 0]
    return {"n": len(rows), "cut": len(cut), "valid_cut": valid_share(cut),
            "valid_whole": valid_share(whole)}


def improve_vs_parent(run: Run, tol: float = 1e-9) -> dict[str, float | int | None] | None:
    """Did self-improvement improve? Trained improve episodes whose parent is an episode of this
    log (`parent_episode`): how many (`n`) and the share valid (`valid`); of the `pairs` where
    parent and child are both valid, the shares where the child's score, in the reward's
    higher-is-better scale (`normalised_score`), is above / within `tol` of / below its
    parent's, and the mean change. None without such episodes (e.g. a log before the fields)."""
    logged = {e.get("episode_id"): e for e in run.episodes
              if e.get("record") and e.get("episode_id") is not None}
    rows = [e for e in trained_episodes(run)
            if e.get("kind") == "improve" and e.get("parent_episode") in logged]
    if not rows:
        return None

    def score(e: dict[str, Any]) -> float | None:
        rec = e["record"]
        v = rec.get("normalised_score")
        return float(v) if rec.get("status") == "valid" and v is not None else None

    pairs = [(score(e), score(logged[e["parent_episode"]])) for e in rows]
    deltas = np.array([c - p for c, p in pairs if c is not None and p is not None])
    share = (lambda m: float(np.mean(m))) if len(deltas) else (lambda m: None)
    return {"n": len(rows), "valid": valid_share(rows), "pairs": len(deltas),
            "better": share(deltas > tol), "same": share(np.abs(deltas) <= tol),
            "worse": share(deltas < -tol),
            "mean_change": float(deltas.mean()) if len(deltas) else None}


def parent_table(study: dict[str, list[Run]]) -> str:
    """Markdown: per run, how its trained improve episodes compare with their parents
    (`improve_vs_parent`)."""
    lines = ["| variant | seed | improve episodes (parent logged) | valid | both valid | child "
             "better / same / worse | mean change (reward scale) |",
             "|---|---|---|---|---|---|---|"]
    for variant, runs in study.items():
        for r in runs:
            vp = improve_vs_parent(r)
            if vp is None:
                lines.append(f"| {variant} | {r.seed} | 0 | — | 0 | — | — |")
                continue
            split = (" / ".join(f"{vp[k]:.2f}" for k in ("better", "same", "worse"))
                     if vp["pairs"] else "—")
            lines.append(f"| {variant} | {r.seed} | {vp['n']} | {fmt_value(vp['valid'], 2)} | "
                         f"{vp['pairs']} | {split} | {fmt_value(vp['mean_change'], 4, True)} |")
    return "\n".join(lines)


def kind_table(study: dict[str, list[Run]]) -> str:
    """Markdown: per run, each prompt kind's valid rate, best-of-N before -> after and trained
    episodes first -> last quarter (`valid_by_kind`)."""
    def arrow(d: dict[str, float | None], a: str, b: str) -> str:
        return f"{fmt_value(d[a], 2)} → {fmt_value(d[b], 2)}"

    head = " | ".join(f"{k}: best-of-N | {k}: trained, first → last quarter"
                      for k in PROMPT_KINDS)
    lines = [f"| variant | seed | {head} |", "|---|---|" + "---|" * 2 * len(PROMPT_KINDS)]
    for variant, runs in study.items():
        for r in runs:
            by = valid_by_kind(r)
            cells = [arrow(by[k], *pair) for k in PROMPT_KINDS
                     for pair in (("eval_initial", "eval_final"), ("train_first", "train_last"))]
            lines.append(f"| {variant} | {r.seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt_value(x: Any, nd: int = 3, sign: bool = False) -> str:
    if x is None:
        return "—"
    return (f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}") if isinstance(x, float) else str(x)


# the gains shown with their standard error
_SE_DIGITS = {"reward_gain": 3, "valid_gain": 3, "test_gain": 4}


def _pm(se: float | None, nd: int) -> str:
    """" ± se" with nd decimals, or nothing without one."""
    return "" if se is None else f" ± {se:.{nd}f}"


def _se_suffix(key: str, check: dict[str, Any]) -> str:
    return _pm(check.get(f"{key}_se"), _SE_DIGITS[key]) if key in _SE_DIGITS else ""


def _mean_pm_se(xs: list[float], nd: int, sign: bool) -> str:
    """The mean of xs ± its standard error over them (sample std / sqrt(n); none below 2)."""
    se = float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None
    return fmt_value(_mean(xs), nd, sign) + _pm(se, nd)


def learning_table(study: dict[str, list[Run]]) -> str:
    """Markdown: one row per run (the checks of `learning_check`), then the mean over seeds of
    each variant against the goals (reward gain >= 2.0, valid gain >= 0.25, test gain >= 0).
    The gains carry their standard errors (`reward_gain_se`, `valid_gain_se`, `test_gain_se`;
    for the mean, `mean_se` of the runs' own, shown only when every run has one)."""
    cols = ("steps", "reward_first", "reward_last", "reward_gain", "valid_initial",
            "valid_final", "valid_gain", "test_initial", "test_final", "test_gain")
    lines = ["| variant | seed | eval N | " + " | ".join(cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    means = []
    for variant, runs in study.items():
        checks = [learning_check(r) for r in runs]
        for c in checks:
            cells = [fmt_value(c[k], 4 if k.startswith("test") else 3, k.endswith("gain"))
                     + _se_suffix(k, c) for k in cols]
            lines.append(f"| {variant} | {c['seed']} | {c['eval_n']} | " + " | ".join(cells)
                         + " |")
        gains = {}
        for k in LEARNING_GOALS:
            xs = [c[k] for c in checks if c[k] is not None]
            gains[k] = float(np.mean(xs)) if xs else None
        met = all(gains[k] is not None and gains[k] >= goal for k, goal in LEARNING_GOALS.items())
        ses = {k: mean_se([c[f"{k}_se"] for c in checks if c[k] is not None])
               for k in _SE_DIGITS}
        means.append(f"| {variant} | {len(checks)} | " + " | ".join(
            fmt_value(gains[k], 4 if k == "test_gain" else 3, True)
            + (_pm(ses[k], _SE_DIGITS[k]) if k in ses else "")
            for k in LEARNING_GOALS) + f" | {'yes' if met else 'no'} |")
    lines += ["", "| variant | seeds | mean reward gain (goal >= 2.0; ± its standard error "
              "from the batch noise) | mean valid gain (goal >= 0.25; ± its standard error "
              "over the paired draws) | mean test gain (goal >= 0; ± its standard error on "
              "the test split) | all goals met |",
              "|---|---|---|---|---|---|", *means]
    return "\n".join(lines)


def run_task(run: Run) -> str:
    """The task a run trained on (its config.json: `task`, or `tasks` for a multi-task run)."""
    cfg = run.config or {}
    return str(cfg.get("tasks") or cfg.get("task") or "?")


_GOAL_DIGITS = {"reward_gain": 2, "valid_gain": 3, "test_gain": 4}  # as the goals are read


def pooled_learning_table(groups: dict[str, list[Run]]) -> str:
    """Markdown: the learning checks of several studies side by side (one row per group, e.g.
    one task's seeds), then all their runs pooled. Per group, the mean over its runs of each
    goal's quantity and whether it meets the goal; pooled, the mean ± its standard error over
    runs (sample std / sqrt(n)), how many runs meet each goal, and how many test picks got
    worse / stayed / got better."""
    goals = list(LEARNING_GOALS)
    head = ("| group | runs | steps | reward gain (goal >= 2.0) | valid gain (goal >= 0.25) | "
            "test gain (goal >= 0) | goals met |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    pooled: list[dict[str, Any]] = []
    for name, runs in groups.items():
        checks = [learning_check(r) for r in runs]
        pooled += checks
        means = {k: _mean([c[k] for c in checks]) for k in ["steps", *goals]}
        met = sum(means[k] is not None and means[k] >= LEARNING_GOALS[k] for k in goals)
        cells = [fmt_value(means["steps"], 1)] + [
            fmt_value(means[k], _GOAL_DIGITS[k], True) for k in goals]
        lines.append(f"| {name} | {len(checks)} | " + " | ".join(cells)
                     + f" | {met} of {len(goals)} |")
    if not pooled:
        return "\n".join(lines)
    cells, met = [], 0
    for k in ["steps", *goals]:
        xs = [float(c[k]) for c in pooled if c[k] is not None]
        m = _mean(xs)
        cell = _mean_pm_se(xs, _GOAL_DIGITS.get(k, 1), k != "steps")
        if k in LEARNING_GOALS:
            met += m is not None and m >= LEARNING_GOALS[k]
            cell += f" ({sum(x >= LEARNING_GOALS[k] for x in xs)} of {len(xs)} runs meet it)"
        cells.append(cell)
    t = [c["test_gain"] for c in pooled if c["test_gain"] is not None]
    lines.append(f"| **all** | {len(pooled)} | " + " | ".join(cells) + f" | {met} of "
                 f"{len(goals)} |")
    lines += ["", f"Test pick over the {len(t)} runs with both picks: worse on "
              f"{sum(x < 0 for x in t)}, the same on {sum(x == 0 for x in t)}, better on "
              f"{sum(x > 0 for x in t)}."]
    return "\n".join(lines)


PAIRED_KEYS = ("steps", "reward_gain", "valid_gain", "test_gain")


def paired_differences(studies: dict[str, dict[str, list[Run]]], a: str,
                       b: str) -> list[dict[str, Any]]:
    """Variant `a` minus variant `b` of each seed that both ran, per study (name -> the
    variants of `load_study`): the difference of each `learning_check` quantity in
    PAIRED_KEYS (None where either lacks it). Two variants of one sweep share a seed's initial
    draws and best-of-N, so the seed's own luck cancels from the differences."""
    rows = []
    for name, variants in studies.items():
        by_seed = {v: {r.seed: learning_check(r) for r in variants.get(v, [])} for v in (a, b)}
        for seed in sorted(set(by_seed[a]) & set(by_seed[b])):
            ca, cb = by_seed[a][seed], by_seed[b][seed]
            rows.append({"study": name, "seed": seed, **{
                k: None if ca[k] is None or cb[k] is None else float(ca[k]) - float(cb[k])
                for k in PAIRED_KEYS}})
    return rows


def paired_table(studies: dict[str, dict[str, list[Run]]], a: str, b: str) -> str:
    """Markdown: `paired_differences` of a over b, one row per study and seed, then all pairs:
    the mean difference ± its standard error over pairs (sample std / sqrt(n)) and how many
    pairs favour a (a larger gain; for steps, more steps) against b."""
    rows = paired_differences(studies, a, b)
    head = " | ".join(f"{k.replace('_', ' ')}: {a} − {b}" for k in PAIRED_KEYS)
    lines = [f"| study | seed | {head} |", "|---|---|" + "---|" * len(PAIRED_KEYS)]
    for r in rows:
        lines.append(f"| {r['study']} | {r['seed']} | " + " | ".join(
            fmt_value(r[k], _GOAL_DIGITS.get(k, 1), True) for k in PAIRED_KEYS) + " |")
    cells = []
    for k in PAIRED_KEYS:
        xs = [r[k] for r in rows if r[k] is not None]
        cells.append(_mean_pm_se(xs, _GOAL_DIGITS.get(k, 1), True)
                     + (f" ({sum(x > 0 for x in xs)} > 0, {sum(x < 0 for x in xs)} < 0)"
                        if xs else ""))
    lines.append(f"| **all** | {len(rows)} pairs | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean(xs: list[Any]) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


# ---------------------------------------------------------------- results page
def run_command(script: str, argv: list[str], drop: tuple[str, ...] = ()) -> str:
    """The command that makes (or resumes) a study's runs: `script` with `argv`, without the
    flags in `drop` (those that only redraw or choose a part), written `--flag=value` or
    `--flag value`."""
    kept, skip_value = [], False
    for a in argv:
        if skip_value and not a.startswith("-"):
            skip_value = False
            continue
        skip_value = False
        if drop and a.startswith(drop):
            skip_value = "=" not in a and a in drop  # its value is the next argument
            continue
        kept.append(a)
    return " ".join(["python", script, *kept])


def run_commits(study: dict[str, list[Run]]) -> set[str]:
    """The commits the study's runs started from (their provenance.json)."""
    out = set()
    for runs in study.values():
        for r in runs:
            p = Path(r.workdir) / "provenance.json"
            if p.exists():
                out |= {s.get("commit", "unknown") for s in json.loads(p.read_text())["starts"]}
    return out


def run_budgets(study: dict[str, list[Run]]) -> dict[float, list[str]]:
    """RL wall-clock budget (s) -> the variants whose runs used it (their config.json); a
    variant may override the base config's run.time_budget_s."""
    out: dict[float, list[str]] = {}
    for variant, runs in study.items():
        for r in runs:
            b = ((r.config or {}).get("run") or {}).get("time_budget_s")
            if b is not None and variant not in out.setdefault(float(b), []):
                out[float(b)].append(variant)
    return out


def results_markdown(study: dict[str, list[Run]], command: str, budget_s: float,
                     title: str | None = None) -> str:
    """A study's results page: command, commit, budget, the ablation table, the learning
    checks of every run and where the valid rate moved (per prompt kind).

    budget_s: the base config's RL budget, reported only when no run's config.json records
    one; otherwise the budgets the runs recorded (per variant when they differ)."""
    head = f"# {title}\n\n" if title else ""
    made = sorted(run_commits(study))
    budgets = run_budgets(study) or {float(budget_s): []}
    if len(budgets) == 1:
        budget = f"{next(iter(budgets)):.0f} s wall-clock"
    else:
        budget = "; ".join(f"{b:.0f} s ({', '.join(v)})" for b, v in sorted(budgets.items())) \
            + " wall-clock"
    return (f"{head}Command: `{command}`  \nRuns made at commit "
            f"{', '.join(f'`{c}`' for c in made) or 'unknown'} (each run's provenance.json); "
            f"tables drawn at commit `{git_commit()}`  \n"
            f"RL budget per run: {budget}.\n\n## Ablation table\n\n{ablation_table(study)}\n\n"
            f"## Learning checks\n\n{learning_table(study)}\n\n"
            f"## Valid rate by prompt kind\n\n{kind_table(study)}\n\n"
            f"## Improve episodes against their parent\n\n{parent_table(study)}\n\n"
            f"## Learner compiles\n\n{compile_table(study)}\n")
