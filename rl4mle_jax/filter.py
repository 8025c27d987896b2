"""The solvability filter (the paper's §3.1): which tasks can RL learn from at all?

RL only learns from reward differences. The paper keeps a task only if the untrained model
already produces at least one valid submission among N = 128 zero-shot samples at T = 0.7.
`filter_task` samples N solve programs from the starting policy, runs and grades each through
the loop's own path (`env.execute.arun_and_grade` on the reward split, the run's reward rules),
and measures what decides whether PPO gets a signal:

- valid rate, reward mean and std;
- separation: the share of consecutive groups of G samples whose rewards are not all equal
  (a group-baseline advantage is zero everywhere else, so this is the share of groups that
  teach anything);
- the best reward-split score, and the test-split score of that pick (run once, on the test
  split, only to place it against the task's reference scores; no decision reads it).

The keep/drop rule (`FilterRule`) reads only reward-split numbers. Samples are written to
`<workdir>/<task>/samples.jsonl` as they finish, so an interrupted filter resumes; the draws
are keyed by (seed, chunk index), so a resumed filter samples what the first one would have.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.execute import arun_and_grade, no_run_record
from rl4mle_jax.env.metrics import oriented_score
from rl4mle_jax.rollout.task_mix import separation

FILTER_VERSION = 1  # bump when what a sample holds changes (old samples are then refused)


@dataclasses.dataclass(frozen=True)
class FilterRule:
    """keep = valid samples >= min_valid and separation >= min_separation.

    The paper's rule is min_valid=1, min_separation=0: one valid submission among N.
    """

    min_valid: int = 1
    min_separation: float = 0.0

    def decide(self, n_valid: int, separation: float | None) -> tuple[bool, str]:
        if n_valid < self.min_valid:
            return False, f"{n_valid} valid < min_valid={self.min_valid}"
        if self.min_separation > 0 and (separation or 0.0) < self.min_separation:
            return False, f"separation {separation:.2f} < min_separation={self.min_separation}"
        return True, f"{n_valid} valid >= {self.min_valid}" + (
            f", separation {separation:.2f} >= {self.min_separation}"
            if self.min_separation > 0 else "")

    def describe(self) -> str:
        rule = f"keep a task with at least {self.min_valid} valid sample(s)"
        if self.min_separation > 0:
            rule += f" and separation >= {self.min_separation}"
        return rule


def summarise(samples: list[dict[str, Any]], direction: str, group_size: int,
              rule: FilterRule) -> dict[str, Any]:
    """The filter's numbers for one task from its samples (ordered by index)."""
    samples = sorted(samples, key=lambda s: s["index"])
    rewards = [s["reward"] for s in samples]
    valid = [s for s in samples if s["status"] == "valid" and s["score"] is not None]
    sep = separation(rewards, group_size)
    keep, why = rule.decide(len(valid), sep)
    best = max(valid, key=lambda s: oriented_score(s["score"], direction), default=None)
    statuses: dict[str, int] = {}
    for s in samples:
        key = s["status"] if s["status"] == "valid" else (s["failure"] or s["status"])
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "n": len(samples), "n_valid": len(valid),
        "valid_rate": len(valid) / max(len(samples), 1),
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "reward_std": float(np.std(rewards)) if rewards else None,
        "separation": sep, "group_size": group_size,
        "best_score": best["score"] if best else None,
        "best_index": best["index"] if best else None,
        "mean_duration_s": float(np.mean([s["duration_s"] for s in samples])) if samples else None,
        "outcomes": dict(sorted(statuses.items(), key=lambda kv: -kv[1])),
        "keep": keep, "reason": why,
    }


def _sample_record(index: int, action: Any, run: Any) -> dict[str, Any]:
    rec = run.reward
    return {"index": index, "status": rec.status, "failure": rec.failure_reason or action.failure,
            "reward": float(rec.reward), "score": rec.score, "duration_s": float(rec.duration_s),
            "milestones": list(rec.milestones), "code": action.code}


class _Samples:
    """samples.jsonl of one task: one line per sample as it finishes, read back on resume."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        meta_path = path.parent / "meta.json"
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            if old != meta:
                changed = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
                raise ValueError(f"{path.parent} holds filter samples made with other settings "
                                 f"({', '.join(changed)} differ); give another --workdir or "
                                 "delete that directory")
        else:
            meta_path.write_text(json.dumps(meta, indent=1))
        self.done: dict[int, dict[str, Any]] = {}
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):  # a line cut by a crash: that sample reruns
                text = text[:text.rfind("\n") + 1]
                path.write_text(text)  # so the next line does not continue the cut one
            for line in text.splitlines():
                s = json.loads(line)
                self.done[int(s["index"])] = s

    def append(self, sample: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(sample) + "\n")
        self.done[sample["index"]] = sample


def sampling_meta(comps: Any, n: int, temperature: float, seed: int) -> dict[str, Any]:
    """What the samples depend on: a workdir made with other settings is refused, not mixed."""
    source = json.dumps(comps.source, sort_keys=True, default=str)
    return {"version": FILTER_VERSION, "task": comps.task.id,
            "task_fingerprint": comps.task.fingerprint(), "n": n, "temperature": temperature,
            "seed": seed, "policy": hashlib.sha256(source.encode()).hexdigest()[:16],
            "max_prompt_tokens": comps.prompt_cfg.max_prompt_tokens,
            "max_response_tokens": comps.prompt_cfg.max_response_tokens}


def filter_task(comps: Any, workdir: Path, n: int = 128, temperature: float = 0.7,
                seed: int = 0, group_size: int = 8, chunk: int = 16, concurrency: int = 2,
                rule: FilterRule = FilterRule(), progress: Any = None) -> dict[str, Any]:
    """Samples, runs and grades N zero-shot solve programs of `comps.task`; returns its entry.

    `workdir` is this task's directory; `progress(k)` is called as k samples finish.
    """
    from rl4mle_jax.best_of_n import solve_prompt_text

    task = comps.task
    store = _Samples(workdir / "samples.jsonl", sampling_meta(comps, n, temperature, seed))
    prompt_ids = comps.tokenizer.encode(solve_prompt_text(comps))
    key = jax.random.PRNGKey(seed)
    if progress is not None:
        progress(len([i for i in store.done if i < n]))
    for start in range(0, n, chunk):
        todo = [i for i in range(start, min(start + chunk, n)) if i not in store.done]
        if not todo:
            continue
        size = min(chunk, n - start)
        out = comps.sampler.generate(comps.params, [prompt_ids] * size,
                                     jax.random.fold_in(key, start // chunk),
                                     max_new_tokens=comps.prompt_cfg.max_response_tokens,
                                     temperature=temperature)
        actions = {i: extract_action(comps.tokenizer.decode(
            out.tokens[i - start, :out.lengths[i - start]].tolist(), skip_special_tokens=True))
            for i in todo}
        asyncio.run(_run_chunk(actions, comps, store, concurrency, progress))
    samples = [store.done[i] for i in range(n)]
    entry = {"task": task.id, "metric": task.metric, "direction": task.direction,
             **summarise(samples, task.direction, group_size, rule)}
    entry["best_test_score"] = _test_score_of_best(comps, workdir, samples, entry)
    entry["references"] = (task.reference_scores or {}).get("test", {})
    return entry


async def _run_chunk(actions: dict[int, Any], comps: Any, store: _Samples, concurrency: int,
                     progress: Any) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, action: Any) -> None:
        if action.ok:
            async with sem:
                run = await arun_and_grade(action.code, comps.task, comps.sandbox,
                                           split="reward", cfg=comps.reward_cfg,
                                           timeout_s=comps.episode_cfg.timeout_s, action=action)
        else:
            run = no_run_record(action, "reward", comps.reward_cfg)
        store.append(_sample_record(i, action, run))
        if progress is not None:
            progress(1)

    await asyncio.gather(*(one(i, a) for i, a in actions.items()))


def _test_score_of_best(comps: Any, workdir: Path, samples: list[dict], entry: dict
                        ) -> float | None:
    """The reward-split pick run once on the test split (cached in test_of_best.json)."""
    if entry["best_index"] is None:
        return None
    path = workdir / "test_of_best.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("index") == entry["best_index"]:
            return cached["score"]
    code = samples[entry["best_index"]]["code"]
    run = asyncio.run(arun_and_grade(code, comps.task, comps.sandbox, split="test",
                                     cfg=comps.reward_cfg,
                                     timeout_s=comps.episode_cfg.timeout_s))
    score = run.reward.score if run.reward.status == "valid" else None
    path.write_text(json.dumps({"index": entry["best_index"], "score": score}))
    return score


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(result: dict[str, Any]) -> str:
    """filter.md: one row per task, the rule and the settings it was made with."""
    lines = [f"# Solvability filter: {result['n']} zero-shot samples per task at T = "
             f"{result['temperature']}",
             "",
             f"Rule: {result['rule']} (the paper's: at least one valid submission among 128). "
             f"Separation: share of groups of {result['group_size']} consecutive samples whose "
             "rewards are not all equal. Scores are on the reward split (carved from the "
             "public training data); `test of best` runs that pick once on the test split, "
             "only to place it against the task's test-split references.",
             "",
             "| task | paper task | valid rate | reward mean ± std | separation | best (reward) "
             "| test of best | references (test) | most common outcomes | keep |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for e in result["tasks"]:
        if "error" in e:
            lines.append(f"| {e['task']} | {'yes' if e.get('paper_task') else ''} | — | — | — "
                         f"| — | — | — | {e['error'][:120]} | no |")
            continue
        refs = ", ".join(f"{k} {v:.4g}" for k, v in e["references"].items()) or "—"
        outcomes = ", ".join(f"{k} {v}" for k, v in list(e["outcomes"].items())[:3])
        lines.append(
            f"| {e['task']} | {'yes' if e.get('paper_task') else ''} | {e['valid_rate']:.3f} "
            f"({e['n_valid']}/{e['n']}) | {e['reward_mean']:.2f} ± {e['reward_std']:.2f} "
            f"| {_fmt(e['separation'], '.2f')} | {_fmt(e['best_score'], '.4f')} "
            f"| {_fmt(e['best_test_score'], '.4f')} | {refs} | {outcomes} "
            f"| {'**yes**' if e['keep'] else 'no'} ({e['reason']}) |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """filter.png: valid rate and separation per task; dropped tasks hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [e for e in result["tasks"] if "error" not in e]
    if not tasks:
        return
    x = np.arange(len(tasks))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(tasks) + 2), 4))
    for off, key, label in ((-0.2, "valid_rate", "valid rate"),
                            (0.2, "separation", f"separation (G={result['group_size']})")):
        vals = [e[key] or 0.0 for e in tasks]
        bars = ax.bar(x + off, vals, 0.4, label=label)
        for b, e in zip(bars, tasks):
            if not e["keep"]:
                b.set_hatch("//")
    ax.set_xticks(x, [e["task"] for e in tasks], rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Solvability filter, N = {result['n']}, T = {result['temperature']} "
                 "(hatched: dropped)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
