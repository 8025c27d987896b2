"""The run's best solution (code + test-split submission) and its Markdown report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.metrics import oriented_score


def brief_eval(result: dict[str, Any]) -> dict[str, Any]:
    pick = result.get("pick", {})
    return {"n": result.get("n"), "valid_rate": result.get("valid_rate"),
            "pick_reward_score": pick.get("reward_score"),
            "pick_test_score": pick.get("test_score"),
            "paper_protocol_best_test_score": result.get("paper_protocol_best_test_score")}


def write_best_solution(comps: Any, out_dir: Path, buffer: Any, final: dict[str, Any]
                        ) -> dict[str, Any] | None:
    """Best of (RL's best episode, final best-of-N pick) by reward-split score, run on test."""
    direction = comps.task.direction
    options = []
    if buffer.best() is not None:
        best = buffer.best()
        options.append(("rl_episode", best["code"], best["record"].get("score")))
    pick = final.get("pick", {})
    if pick.get("code") and pick.get("reward_score") is not None:
        options.append(("final_best_of_n", pick["code"], pick["reward_score"]))
    if not options:
        return None
    origin, code, reward_score = max(options, key=lambda o: oriented_score(o[2], direction))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "solution.py").write_text(code)
    run = run_and_grade(code, comps.task, comps.sandbox, split="test", keep_submission=True)
    info: dict[str, Any] = {"origin": origin, "reward_score": reward_score,
                            "status": run.reward.exec_status, "duration_s": run.duration_s,
                            "reward": run.reward.to_dict()}
    if run.grade is not None:
        info["test"] = run.grade.to_dict()
    if run.submission is not None:  # the bytes that were graded, read without following links
        (out_dir / "submission.csv").write_bytes(run.submission)
    (out_dir / "result.json").write_text(json.dumps(info, indent=1, default=str))
    return info


def _fmt(x: Any) -> str:
    return "—" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))


def write_report(workdir: Path, config: Any, comps: Any, initial: dict, final: dict,
                 summary: dict, best: dict | None) -> Path:
    """report.md: initial vs final best-of-N on both splits, against the reference scores."""
    task = comps.task
    refs = task.reference_scores or {}
    loop, slots = summary.get("loop", {}), summary.get("slots", {})
    rows = [("initial policy", brief_eval(initial)), ("final policy", brief_eval(final))]
    lines = [
        f"# Run report: {task.id}",
        "",
        f"Metric: {task.metric} ({task.direction} is better). Policy source: "
        f"`{comps.source.get('hf_dir') or comps.source.get('warmstart')}`.",
        f"RL: {loop.get('step')} learner steps, {loop.get('episodes_trained')} episodes trained "
        f"({loop.get('episodes_dropped')} dropped as stale), {loop.get('wall_s', 0):.0f} s "
        f"wall-clock. Slot utilisation {slots.get('utilisation', 0):.2f} (a synchronous loop "
        f"on the same episodes: {slots.get('sync_utilisation', 0):.2f}).",
        "",
        f"## Best-of-N (N = {config.run.eval_samples}; pick made on the reward split)",
        "",
        "| policy | valid rate | pick: reward split | pick: test split | best test of N "
        "(paper protocol) |",
        "|---|---|---|---|---|",
    ]
    for name, b in rows:
        lines.append(f"| {name} | {_fmt(b['valid_rate'])} | {_fmt(b['pick_reward_score'])} | "
                     f"{_fmt(b['pick_test_score'])} | "
                     f"{_fmt(b['paper_protocol_best_test_score'])} |")
    lines += ["", "## Reference scores", "", "| split | " + " | ".join(
        sorted({k for v in refs.values() if isinstance(v, dict) for k in v})) + " |"]
    keys = sorted({k for v in refs.values() if isinstance(v, dict) for k in v})
    lines.append("|---|" + "---|" * len(keys))
    for split, v in refs.items():
        if isinstance(v, dict):
            lines.append(f"| {split} | " + " | ".join(_fmt(v.get(k)) for k in keys) + " |")
    lines += ["", "## Best solution", ""]
    if best is None:
        lines.append("No valid solution was found.")
    else:
        test = (best.get("test") or {}).get("score")
        lines.append(f"From {best['origin']}: reward split {_fmt(best['reward_score'])}, test "
                     f"split {_fmt(test)}. Code: `best_solution/solution.py`, submission: "
                     "`best_solution/submission.csv`.")
    inst = summary.get("instrument", {})
    if "instrument/lm_accept_rate" in inst:
        lines += ["", f"LM instrumentation acceptance: {inst['instrument/lm_accept_rate']:.2f}"]
    lines += ["", "Plots: `plots/*.png`. Experience log: `experience.jsonl`. TensorBoard: `tb/`."]
    path = workdir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
