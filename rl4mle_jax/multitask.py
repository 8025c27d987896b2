"""Multi-task training's per-task pieces: best-of-N per task, metrics, plots and the report.

One policy trains on every task of `config.tasks` (train.py draws each episode's task with
rollout/task_mix.py). What a single-task run reports once is reported here per task, each on
that task's own view of the components (components.task_views): best-of-N before and after RL
(eval_initial.json / eval_final.json hold {"tasks": {id: <the single-task record>}}), the best
solution (best_solution/<id>/), `task/<id>/...` metrics, and a report section per task.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from rl4mle_jax.best_of_n import FINALIST_K_SE, MAX_FINALISTS, best_of_n
from rl4mle_jax.report import PICK_MADE, _against_refs, _fmt, best_solution_line, brief_eval
from rl4mle_jax.tracking import DEFAULT_PLOTS


def evaluate_tasks(views: dict[str, Any], params: Any, n: int, rng: Any, temperature: float,
                   concurrency: int, reuse: int = 0, truncation: dict[str, Any] | None = None,
                   pick: str = "max", select_folds: int = 0,
                   finalist_se: float = FINALIST_K_SE, max_finalists: int = MAX_FINALISTS
                   ) -> dict[str, Any]:
    """Best-of-N on each task, each with the same key: the draws a single-task run of that
    task with this seed makes, so a per-task policy and the multi-task one compare like for
    like."""
    return {"n": n, "tasks": {t: best_of_n(v, params, n, rng, temperature, concurrency, reuse,
                                           truncation, pick, select_folds, finalist_se,
                                           max_finalists)
                              for t, v in views.items()}}


def brief_tasks(result: dict[str, Any]) -> dict[str, Any]:
    return {t: brief_eval(r) for t, r in result["tasks"].items()}


def new_best() -> dict[str, Any]:
    return {"reward": -math.inf, "score": None, "episode": None}


def task_metrics(batch: list[Any], task_ids: list[str], mix: Any, best: dict[str, Any],
                 buffers: dict[str, Any], rescues: dict[str, Any]) -> dict[str, float]:
    """`task/<id>/...` scalars after a learner step: this batch's rows of the task (episodes,
    reward_mean, valid_rate), and the run's state for it (separation, sampling_prob, drawn,
    score_best, buffer_size, rescues, dropped)."""
    out: dict[str, float] = {}
    probs = mix.probs()
    for i, (t, sep) in enumerate(zip(task_ids, mix.separations())):
        rows = [e for e in batch if e.task == t]
        p = f"task/{t}/"
        out[p + "episodes"] = float(len(rows))
        if rows:
            out[p + "reward_mean"] = float(np.mean([e.reward for e in rows]))
            out[p + "valid_rate"] = float(np.mean([e.record["status"] == "valid"
                                                   for e in rows]))
        if sep is not None:
            out[p + "separation"] = sep
        if best[t]["score"] is not None:
            out[p + "score_best"] = float(best[t]["score"])
        out[p + "sampling_prob"] = float(probs[i])
        out[p + "drawn"] = float(mix.drawn[t])
        out[p + "buffer_size"] = float(len(buffers[t]))
        out[p + "rescues"] = float(len(rescues[t].rescues))
        out[p + "dropped"] = float(t in mix.dropped)
    return out


def task_plots(task_ids: list[str]) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """plot_metrics' plots for a multi-task run: the default ones and one per task quantity."""
    per = (("tasks_reward", "Mean reward per task (its rows of each batch)", "reward_mean"),
           ("tasks_valid_rate", "Valid rate per task (its rows of each batch)", "valid_rate"),
           ("tasks_best_score", "Best score per task (reward split)", "score_best"),
           ("tasks_sampling", "Task sampling probability", "sampling_prob"))
    return DEFAULT_PLOTS + tuple((stem, title, tuple(f"task/{t}/{key}" for t in task_ids))
                                 for stem, title, key in per)


def write_report(workdir: Path, config: Any, views: dict[str, Any], initial: dict,
                 final: dict, summary: dict, bests: dict[str, Any]) -> Path:
    """report.md of a multi-task run: the run, then per task its draws, best-of-N before and
    after RL and its best solution against the task's references."""
    loop, slots, mix = summary["loop"], summary.get("slots", {}), summary["task_mix"]
    source = next(iter(views.values())).source
    lines = [
        f"# Run report: {len(views)} tasks, one policy",
        "",
        f"Tasks: {', '.join(views)}; drawn per episode by `{mix['mode']}` (floor "
        f"{mix['floor']}). Policy source: `{source.get('hf_dir') or source.get('warmstart')}`.",
        f"RL: {loop.get('step')} learner steps, {loop.get('episodes_trained')} episodes trained, "
        f"{loop.get('wall_s', 0):.0f} s wall-clock. Slot utilisation "
        f"{slots.get('utilisation', 0):.2f}.",
        *([f"**Stopped early:** {loop['stop_reason']}"] if loop.get("stop_reason") else []),
        "",
        f"## Best-of-N per task (N = {config.run.eval_samples}; pick "
        f"{PICK_MADE[config.run.eval_pick]})",
        "",
        "| task | episodes drawn | policy | valid rate | pick: reward split | pick: test split "
        "| best test of N (paper protocol) |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in views:
        for name, ev in (("initial", initial), ("final", final)):
            b = brief_eval(ev["tasks"][t])
            lines.append(f"| {t} | {mix['drawn'][t] if name == 'initial' else ''} | {name} | "
                         f"{_fmt(b['valid_rate'])} | {_fmt(b['pick_reward_score'])} | "
                         f"{_fmt(b['pick_test_score'])} | "
                         f"{_fmt(b['paper_protocol_best_test_score'])} |")
    lines += ["", "![reward per task](plots/tasks_reward.png) "
              "![sampling probability](plots/tasks_sampling.png)", ""]
    for t, view in views.items():
        task, refs = view.task, view.task.reference_scores or {}
        lines += [f"## {t}", "", f"Metric: {task.metric} ({task.direction} is better)."]
        if t in mix["dropped"]:
            lines.append(f"**Dropped from the mix:** {mix['dropped'][t]}")
        pick = final["tasks"][t].get("pick", {}).get("test_score")
        lines.append("Final pick on the test split against the reference scores: "
                     + _against_refs(pick, refs.get("test") or {}, task.direction) + ".")
        lines += ["Best solution: " + best_solution_line(bests.get(t), f"best_solution/{t}"), ""]
    lines += ["Plots: `plots/*.png` (`tasks_*.png` per task). Metrics `task/<id>/...` in "
              "`metrics.jsonl`; drops and rescues in `rescues.jsonl`."]
    path = workdir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
