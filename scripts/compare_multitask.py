"""One multi-task policy against per-task policies, on the same total RL budget.

For each seed: a policy per task with `--budget_s` seconds of RL each, and one policy trained
on all tasks at once (`config.tasks`) for n_tasks × budget_s. Every run starts from the same
initial policy, the warm start built on all the tasks (loaded as `model.hf_dir`, so the
configs differ only in the task list and the budget), and each task's best-of-N before and
after RL draws with the same key in both arms. The initial best-of-N of a task is therefore
the same in both arms; the multi-task run takes the per-task runs' copies instead of
sampling them again. Prints (and writes `compare.md`, `compare.json`) a table per task: best-of-N
valid rate and the test-split score of the pick (made on the reward split), initial → final,
learner steps and the episodes trained on that task. Re-running resumes: finished runs are
read back, interrupted ones continue from their checkpoints.

  python scripts/compare_multitask.py --tasks food-reviews,telco-churn,digits --budget_s 180 \
      --seeds 0,1 --workdir workdirs/compare_multitask
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rl4mle_jax.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()  # before JAX allocates anything (rl4mle_jax/allocator.py)

from configs import task as task_config  # noqa: E402
from rl4mle_jax import compile_cache  # noqa: E402
from rl4mle_jax.report import brief_eval  # noqa: E402
from rl4mle_jax.study import fmt_value  # noqa: E402
from rl4mle_jax.tracking import read_metrics  # noqa: E402


def base_config(overrides: list[str]) -> Any:
    cfg = task_config.get_config()
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            parsed = ast.literal_eval(value)  # numbers, True/False, tuples
        except (ValueError, SyntaxError):
            parsed = value  # a string
        cfg.update_from_flattened_dict({key: parsed})
    return cfg


def shared_policy(cfg: Any, tasks: list[str], workdir: Path) -> tuple[str, list[str]]:
    """The warm start built on all the tasks (cached), which every arm starts from, and the
    tasks' ids."""
    from rl4mle_jax.components import build_components, task_views

    c = cfg.copy_and_resolve_references()
    c.tasks = ",".join(tasks)
    comps = build_components(c, workdir)
    views = task_views(comps)
    for view in views.values():
        view.sandbox.close()
    return str(Path(comps.source["warmstart"])), list(views)


def run_once(cfg: Any, workdir: Path) -> None:
    from rl4mle_jax.train import train

    if (workdir / "eval_final.json").exists():
        logging.info("done already: %s", workdir)
        return
    logging.info("training %s", workdir)
    train(cfg, workdir)


def _steps(workdir: Path) -> tuple[int, list[dict[str, float]]]:
    rows = read_metrics(workdir / "metrics.jsonl")
    return (int(rows[-1]["step"]) if rows else 0), rows


def collect(workdir: Path, tasks: list[str], seeds: list[int], budget_s: float
            ) -> dict[str, list[dict[str, Any]]]:
    """Per task, one row per (arm, seed) from the runs' evaluations and metrics."""
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in tasks}
    for seed in seeds:
        multi = workdir / "multi" / f"seed{seed}"
        for t in tasks:
            single = workdir / "single" / t / f"seed{seed}"
            for arm, wd, budget in (("per-task", single, budget_s),
                                    ("multi-task", multi, budget_s * len(tasks))):
                if not (wd / "eval_final.json").exists():
                    continue
                ev = [json.loads((wd / f).read_text()) for f in ("eval_initial.json",
                                                                 "eval_final.json")]
                if arm == "multi-task":
                    ev = [e["tasks"][t] for e in ev]
                init, final = brief_eval(ev[0]), brief_eval(ev[1])
                steps, rows = _steps(wd)
                episodes = (sum(r.get(f"task/{t}/episodes", 0) for r in rows)
                            if arm == "multi-task" else rows[-1]["episodes/trained"] if rows
                            else 0)
                out[t].append({"arm": arm, "seed": seed, "budget_s": budget, "steps": steps,
                               "episodes": int(episodes),
                               "valid_initial": init["valid_rate"],
                               "valid_final": final["valid_rate"],
                               "test_initial": init["pick_test_score"],
                               "test_final": final["pick_test_score"]})
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return float(np.mean(vals)) if vals else None


def markdown(results: dict[str, list[dict[str, Any]]], command: str) -> str:
    lines = ["# One multi-task policy vs per-task policies (same total RL budget)", "",
             f"Command: `{command}`", ""]
    for t, rows in results.items():
        lines += [f"## {t}", "",
                  "| policy | seed | RL budget (s) | learner steps | episodes trained on the "
                  "task | valid rate: initial → final | test pick: initial → final |",
                  "|---|---|---|---|---|---|---|"]
        for arm in ("per-task", "multi-task"):
            mine = [r for r in rows if r["arm"] == arm]
            for r in mine + ([{"seed": "mean", **{k: _mean(mine, k) for k in (
                    "budget_s", "steps", "episodes", "valid_initial", "valid_final",
                    "test_initial", "test_final")}}] if len(mine) > 1 else []):
                lines.append(
                    f"| {arm} | {r['seed']} | {fmt_value(r['budget_s'], 0)} | "
                    f"{fmt_value(r['steps'], 1)} | {fmt_value(r['episodes'], 0)} | "
                    f"{fmt_value(r['valid_initial'])} → {fmt_value(r['valid_final'])} | "
                    f"{fmt_value(r['test_initial'], 4)} → {fmt_value(r['test_final'], 4)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", required=True, help="comma-separated task ids or directories")
    ap.add_argument("--budget_s", type=float, required=True, help="RL seconds per task")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. run.eval_samples=16)")
    args = ap.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(tasks) < 2 or len(set(tasks)) != len(tasks):
        ap.error(f"--tasks: give at least two distinct tasks, got {tasks}")
    if args.budget_s <= 0:
        ap.error(f"--budget_s: must be > 0, got {args.budget_s}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = base_config(args.set)
    cfg.run.progress = False
    hf_dir, ids = shared_policy(cfg, tasks, workdir / "policy")
    for seed in seeds:
        for name, t in zip(tasks, ids):
            c = cfg.copy_and_resolve_references()
            c.update_from_flattened_dict({"seed": seed, "task": name, "tasks": "",
                                          "model.hf_dir": hf_dir,
                                          "run.time_budget_s": args.budget_s})
            run_once(c, workdir / "single" / t / f"seed{seed}")
        c = cfg.copy_and_resolve_references()
        c.update_from_flattened_dict({"seed": seed, "tasks": ",".join(tasks),
                                      "model.hf_dir": hf_dir,
                                      "run.time_budget_s": args.budget_s * len(tasks)})
        multi = workdir / "multi" / f"seed{seed}"
        multi.mkdir(parents=True, exist_ok=True)
        initial = multi / "eval_initial.json"
        singles = [workdir / "single" / t / f"seed{seed}" / "eval_initial.json" for t in ids]
        if not initial.exists() and all(p.exists() for p in singles):
            # Same policy, same key, same prompts: the per-task runs' draws, not re-sampled.
            initial.write_text(json.dumps({"n": cfg.run.eval_samples, "tasks": {
                t: json.loads(p.read_text()) for t, p in zip(ids, singles)}}, indent=1))
        run_once(c, multi)
    results = collect(workdir, ids, seeds, args.budget_s)
    text = markdown(results, "python scripts/compare_multitask.py " + " ".join(
        sys.argv[1:] if argv is None else argv))
    (workdir / "compare.md").write_text(text + "\n")
    (workdir / "compare.json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    compile_cache.enable()  # here, not in main(): tests call main() in their own process
    main()
