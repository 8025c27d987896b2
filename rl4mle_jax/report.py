"""The run's best solution (code + test-split submission) and its Markdown report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rl4mle_jax import arrival_replay, study
from rl4mle_jax.best_of_n import beats_on_folds, run_on_folds, runs_of, selection_runs
from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.env.tasks import select_splits


def brief_eval(result: dict[str, Any]) -> dict[str, Any]:
    pick = result.get("pick", {})
    return {"n": result.get("n"), "valid_rate": result.get("valid_rate"),
            "pick_reward_score": pick.get("reward_score"),
            "pick_test_score": pick.get("test_score"),
            "paper_protocol_best_test_score": result.get("paper_protocol_best_test_score")}


def write_best_solution(comps: Any, out_dir: Path, buffer: Any, final: dict[str, Any],
                        rule: str = "max", folds: int = 0) -> dict[str, Any] | None:
    """Best of (RL's best episode, final best-of-N pick), run on test. Under `rule` "max" the
    better reward-split score wins. Under the other pick rules the RL episode runs on the same
    `folds` selection splits as the pick (recorded in `final["selection"]`) and replaces the
    pick only where it is better there by more than PICK_K_SE paired standard errors
    (`best_of_n.beats_on_folds`): its reward-split score is the maximum over every episode of
    the run, more inflated by the split's noise than a finalist's among N, so only splits it
    was not chosen on can compare the two; and a near-tie there is noise, where the pick is the
    evaluated one (taken on the better mean alone, the RL episode won five of nine live runs,
    each by under half a paired s.e., and was worse on test in three, equal in one;
    docs/learning_check/results_disjoint.md)."""
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
    if rule != "max" and folds and len({o[1] for o in options}) > 1:
        splits = select_splits(folds)
        runs = selection_runs(final)
        run_on_folds([o[1] for o in options], comps.task, comps.sandbox, splits, runs,
                     comps.episode_cfg.timeout_s)
        rl, fin = options  # two distinct programs: the RL episode, the final pick
        take_rl = beats_on_folds(runs_of(final, rl[1]), runs_of(final, fin[1]), splits,
                                 direction)
        origin, code, reward_score = rl if take_rl else fin
    else:
        origin, code, reward_score = max(options, key=lambda o: oriented_score(o[2],
                                                                               direction))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "solution.py").write_text(code)
    run = run_and_grade(code, comps.task, comps.sandbox, split="test", keep_submission=True)
    info: dict[str, Any] = {"origin": origin, "reward_score": reward_score, "rule": rule,
                            "select_scores": {sp: r.get("score") for sp, r in
                                              runs_of(final, code).items()},
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


def plot_learning_curve(run: study.Run, refs: dict[str, Any], direction: str, out: Path
                        ) -> Path | None:
    """plots/learning_curve.png: the batch reward per learner step with its moving mean over a
    quarter of the steps, and the best reward-split score so far against the task's reference
    scores on that split."""
    x, y = study.curve(run, "reward/mean")
    if not len(x):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.plot(x, y, ".", alpha=0.6, label="batch mean reward")
    w = max(1, len(y) // 4)
    smoothed = study.curve(run, "reward/mean", smooth=w)[1]
    a.plot(x[w - 1:], smoothed[w - 1:], label=f"moving mean over {w} steps")  # full windows
    a.set_title("Batch reward per learner step")
    bx, by = study.curve(run, "score/best")
    if len(bx):
        b.plot(bx, by, label="best reward-split score so far")
    for i, (name, score) in enumerate(sorted((refs.get("reward") or {}).items())):
        if isinstance(score, (int, float)):
            b.axhline(score, color=f"C{i + 2}", ls="--", label=f"{name} reference")
    b.set_title(f"Best score ({direction} is better)")
    for ax in (a, b):
        ax.set_xlabel("wall-clock (min)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _against_refs(score: float | None, refs: dict[str, Any], direction: str) -> str:
    """'0.8755: +0.0111 over baseline (0.8644), +0.0046 over strong (0.8709)' (oriented)."""
    if score is None:
        return "no valid pick"
    parts = [f"{oriented_score(score, direction) - oriented_score(ref, direction):+.4f} over "
             f"{name} ({ref:.4f})" for name, ref in sorted(refs.items())
             if isinstance(ref, (int, float))]
    return f"{score:.4f}" + (": " + ", ".join(parts) if parts else " (no reference scores)")


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


PICK_MADE = {"max": "made on the reward split", "cv": "made on the reward and selection splits",
             "cv_median": "made on the median of the reward and selection splits",
             "folds": "made on the selection splits"}


def _pick_rows(c: dict[str, Any], goal: dict[str, float]) -> list[str]:
    """The learning table's test-pick row(s): the run's pick, and the reward split's maximum
    beside it when the pick rule is another."""
    rows = []
    for name, label in (("test", f"test score of the pick ({PICK_MADE[c['pick_rule']]}, "
                                 f"`run.eval_pick={c['pick_rule']}`)"),
                        ("test_max", "test score of the reward split's maximum (the \"max\" "
                                     "rule, for comparison)")):
        if f"{name}_gain" not in c:
            continue
        se = c[f"{name}_gain_se"]
        rows.append(f"| {label} | {_fmt(c[f'{name}_initial'])} | {_fmt(c[f'{name}_final'])} | "
                    f"{study.fmt_value(c[f'{name}_gain'], 4, True)}"
                    + (f" ± {se:.4f} (paired bootstrap on the test split)" if se is not None
                       else "") + (f" | >= {goal['test_gain']:+g} |" if name == "test"
                                   else " | — |"))
    return rows


def learning_lines(workdir: Path, refs: dict[str, Any], direction: str) -> list[str]:
    """The report's learning section: the curve and study.learning_check's numbers."""
    run = study.load_run(workdir)
    c, goal = study.learning_check(run), study.LEARNING_GOALS
    lines = ["## Learning", ""]
    if plot_learning_curve(run, refs, direction, workdir / "plots" / "learning_curve.png"):
        lines += ["![learning curve](plots/learning_curve.png)", ""]
    fv = study.fmt_value
    lines += [
        "| check | before | after | change | goal (issue 11, mean over seeds) |",
        "|---|---|---|---|---|",
        f"| batch mean reward: first vs last quarter of {c['steps']} steps | "
        f"{_fmt(c['reward_first'])} | {_fmt(c['reward_last'])} | "
        f"{fv(c['reward_gain'], 3, True)}"
        + (f" ± {c['reward_gain_se']:.3f} (batch noise)" if c["reward_gain_se"] is not None
           else "") + f" | >= {goal['reward_gain']:+g} |",
        f"| best-of-{c['eval_n']} valid rate (same draws) | {_fmt(c['valid_initial'])} | "
        f"{_fmt(c['valid_final'])} | {fv(c['valid_gain'], 3, True)}"
        + (f" ± {c['valid_gain_se']:.3f} (paired draws)" if c["valid_gain_se"] is not None
           else "") + f" | >= {goal['valid_gain']:+g} |",
        *_pick_rows(c, goal),
    ]
    for kind, k in c["by_kind"].items():
        lines.append(
            f"| valid rate of the {kind} candidates among the {c['eval_n']} (trained {kind} "
            f"episodes, first vs last quarter: {_fmt(k['train_first'])} → "
            f"{_fmt(k['train_last'])}) | "
            f"{_fmt(k['eval_initial'])} | {_fmt(k['eval_final'])} | "
            f"{fv(_diff(k['eval_final'], k['eval_initial']), 3, True)} | — |")
    pc = study.parent_cut(run)
    if pc and pc["cut"]:
        lines += ["", f"Improve prompts that left out lines of their parent program to fit "
                  f"`prompt.max_prompt_tokens`: {pc['cut']} of {pc['n']} trained improve "
                  f"episodes (valid rate {_fmt(pc['valid_cut'])} with the parent cut, "
                  f"{_fmt(pc['valid_whole'])} with it whole); the policy rewrites lines it "
                  f"cannot see."]
    vp = study.improve_vs_parent(run)
    if vp and vp["pairs"]:
        lines += ["", f"Trained improve episodes against their parent: {vp['n']} with the parent "
                  f"in this log, valid rate {_fmt(vp['valid'])}; of the {vp['pairs']} where both "
                  f"are valid the child scored better in {vp['better']:.0%}, the same in "
                  f"{vp['same']:.0%} and worse in {vp['worse']:.0%} (mean change "
                  f"{vp['mean_change']:+.4f} in the reward's score scale, higher is better)."]
    lines += [
        "",
        "Final pick on the test split against the reference scores: "
        + _against_refs(c["test_final"], refs.get("test") or {}, direction) + ".",
    ]
    return lines


def bucket_label(row: dict[str, Any]) -> str:
    """'1.41-2.83' (seconds), '>= 11585' for the open last bucket."""
    if not math.isfinite(row["hi_s"]):
        return f">= {row['lo_s']:.3g}"
    return f"{row['lo_s']:.3g}-{row['hi_s']:.3g}"


def plot_arrival_bias(bias: dict[str, Any], out: Path) -> bool:
    """plots/arrival_bias.png: started vs trained episodes per Δt bucket; their ratio beside
    p̂, the smoothed inclusion probability that inverse_inclusion weights divide by."""
    if not bias["buckets"]:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = bias["buckets"]
    labels = [bucket_label(x) for x in b]
    idx = np.arange(len(b))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax1.bar(idx - 0.2, [x["started"] for x in b], 0.4, label="started")
    ax1.bar(idx + 0.2, [x["trained"] for x in b], 0.4, label="trained")
    ax1.set_ylabel("episodes")
    ax1.legend(fontsize=8)
    ax2.plot(idx, [x["rate"] for x in b], "o", label="trained / started")
    ax2.plot(idx, [x["inclusion"] for x in b], "s--", label="p̂ (smoothed)", alpha=0.8)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("inclusion probability")
    ax2.legend(fontsize=8, loc="lower left")
    slope = bias["slope"]
    ax2.set_title("slope of log ratio vs log Δt: "
                  + ("n/a" if slope is None else f"{slope:+.2f}") + " (premise: -1)", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xticks(idx, labels, rotation=45, fontsize=7)
        ax.set_xlabel(f"Δt bucket (s; run.duration_source={bias['duration_source']})",
                      fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def arrival_lines(workdir: Path) -> list[str]:
    """The arrival bias of the run (arrival_replay.arrival_bias): does DAG's premise hold here, and
    which p̂ would inverse_inclusion divide by?"""
    bias = arrival_replay.arrival_bias(study.load_run(workdir))
    lines = ["## Arrival bias", ""]
    if not bias["buckets"]:
        return lines + ["No episode finished."]
    if plot_arrival_bias(bias, workdir / "plots" / "arrival_bias.png"):
        lines += ["![arrival bias](plots/arrival_bias.png)", ""]
    slope = bias["slope"]
    verdict = ("not enough Δt buckets to tell" if slope is None else
               "close to DAG's premise (inclusion ∝ 1/Δt, slope -1): batch_mean weights fit"
               if slope < -0.5 else
               "far from DAG's premise (slope -1): few episodes are lost, so batch_mean weights "
               "over-correct (see run.admission, learner.duration_weighting)")
    lines += [
        f"{bias['started']} episodes started: {bias['trained']} trained, {bias['dropped']} "
        f"dropped (stale or failed), {bias['censored']} still running at the end (censored, "
        f"not lost). Δt: run.duration_source={bias['duration_source']}. Slope of "
        f"log(trained/started) against log Δt: {'n/a' if slope is None else f'{slope:+.2f}'}, "
        f"{verdict}. p̂: the smoothed P(trained | started, Δt) of `rl.arrival.ArrivalModel` "
        "at the bucket's mean Δt: learner.duration_weighting=inverse_inclusion weights a "
        "sample by 1/p̂ (over its batch mean).",
        "",
        "| Δt bucket (s) | mean Δt (s) | started | trained | dropped | still running | "
        "trained / started | p̂ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in bias["buckets"]:
        seen = b["trained"] + b["dropped"] > 0  # else no Δt or ratio, p̂ is the pooled rate
        at, rate = (f"{b['at_s']:.3g}", _fmt(b["rate"])) if seen else ("—", "—")
        lines.append(f"| {bucket_label(b)} | {at} | {b['started']:.4g} | {b['trained']} | "
                     f"{b['dropped']} | {b['censored']} | {rate} | {b['inclusion']:.4f} |")
    return lines


def best_solution_line(best: dict[str, Any] | None, folder: str = "best_solution") -> str:
    """Where the run's best solution came from and what it scores (write_best_solution's info)."""
    if best is None:
        return "No valid solution was found."
    test = (best.get("test") or {}).get("score")
    return (f"From {best['origin']}: reward split {_fmt(best['reward_score'])}, test split "
            f"{_fmt(test)}. Code: `{folder}/solution.py`, submission: `{folder}/submission.csv`.")


def warmup_lines(warmup: dict) -> list[str]:
    """The compile time spent before the RL clock (`run.warmup`), if any."""
    if not warmup:
        return []
    shapes = ", ".join(f"({p}, {r})" for p, r in warmup["train_step_shapes"]) or "none"
    return [f"Warm-up before the RL clock: {warmup['seconds']:.0f} s ({warmup['sampler_programs']} "
            f"sampler programs in {warmup['sampler_s']:.0f} s; the train step at (P, R) "
            f"{shapes} in {warmup['train_step_s']:.0f} s)."]


def instrument_lines(inst: dict) -> list[str]:
    """How the frozen copy's instrumentation answers fared (the instrumenter's counters)."""
    if "instrument/lm_accept_rate" not in inst:
        return []
    accepted, rejected = int(inst.get("instrument/lm_accepted", 0)), int(
        inst.get("instrument/lm_rejected", 0))
    text = (f"LM instrumentation acceptance: {inst['instrument/lm_accept_rate']:.2f} "
            f"({accepted} of {accepted + rejected} answers")
    if inst.get("instrument/lm_realigned"):
        text += f", {int(inst['instrument/lm_realigned'])} of them realigned (`instrument.realign`)"
    reasons = {k.removeprefix("instrument/lm_rejected_"): int(v) for k, v in sorted(inst.items())
               if k.startswith("instrument/lm_rejected_")}
    if rejected:
        text += (f"; the other {rejected} ran with the static instrumenter's markers: "
                 + ", ".join(f"{k} {v}" for k, v in reasons.items()))
    return ["", text + ")."]


def lane_lines(lane: dict) -> list[str]:
    """Where the RL wall-clock went on the device lanes (the last session of the run)."""
    if not lane or lane.get("wall_s", 0) <= 0:
        return []
    parts = [f"train steps {lane['train_steps_s']:.0f} s ({lane['train_steps']})"]
    for name, what in (("policy", "policy sampling"), ("frozen", "frozen-copy instrumentation")):
        if name in lane:
            d = lane[name]
            if d.get("calls"):  # the static service: requests merged into sampler calls
                served = (f"{d['requests']} requests in {d['calls']} sampler calls, "
                          f"{d['requests'] / d['calls']:.2f} per call")
            elif d.get("engine_calls"):  # the continuous engine
                served = f"{d['requests']} requests, {d['engine_calls']} engine calls"
            else:
                served = f"{d['requests']} requests"
            parts.append(f"{what} {d['busy_s']:.0f} s ({served}, {d['tokens']} tokens)")
    out = [f"Device lane time in {lane['wall_s']:.0f} s of RL: " + "; ".join(parts) + "."]
    if "host_cpu_s" in lane:
        out.append(f"CPU in that time: this process {lane['host_cpu_s']:.0f} s (the lanes and "
                   f"the host's own work), the sandboxed programs {lane['programs_cpu_s']:.0f} s "
                   f"({lane['program_runs']} runs; reused runs cost none).")
    return out


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
        *warmup_lines(summary.get("warmup") or {}),
        *lane_lines(summary.get("lane") or {}),
        *([f"**Stopped early:** {loop['stop_reason']}"] if loop.get("stop_reason") else []),
        "",
        f"## Best-of-N (N = {config.run.eval_samples}; pick {PICK_MADE[config.run.eval_pick]})",
        "",
        "| policy | valid rate | pick: reward split | pick: test split | best test of N "
        "(paper protocol) |",
        "|---|---|---|---|---|",
    ]
    for name, b in rows:
        lines.append(f"| {name} | {_fmt(b['valid_rate'])} | {_fmt(b['pick_reward_score'])} | "
                     f"{_fmt(b['pick_test_score'])} | "
                     f"{_fmt(b['paper_protocol_best_test_score'])} |")
    lines += ["", *learning_lines(workdir, refs, task.direction)]
    lines += ["", *arrival_lines(workdir)]
    lines += ["", "## Reference scores", ""]
    keys = sorted({k for v in refs.values() if isinstance(v, dict) for k in v})
    if keys:
        lines += ["| split | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        lines += [f"| {split} | " + " | ".join(_fmt(v.get(k)) for k in keys) + " |"
                  for split, v in refs.items() if isinstance(v, dict)]
    else:
        lines.append("This task has no reference scores (`reference_scores` in its task.json), "
                     "so the pick is not placed against a baseline.")
    lines += ["", "## Best solution", "", best_solution_line(best)]
    lines += instrument_lines(summary.get("instrument", {}))
    lines += ["", "Plots: `plots/*.png`. Experience log: `experience.jsonl`. TensorBoard: `tb/`."]
    path = workdir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
