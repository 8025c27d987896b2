"""Replays the best-of-N pick of finished runs under other pick rules, on their own candidates.

    python experiments/pick_replay.py workdirs/lc_chile workdirs/lc_house ... [--folds 2]

For every run (`<root>/<variant>/seed<k>/`) and each of its two evaluations (initial, final), the
finalists (`best_of_n.finalists`: distinct programs valid on the reward split within `--k-se`
paired standard errors of the best, at most `--max-finalists`) run once more on `--folds`
selection splits (`Task` "select<k>": carves of public train like the reward split, never
trained on, answers disjoint from the reward split's). The script then scores each pick rule
by the test split score of its pick, per evaluation against the reward-split maximum and per
run as the learning check's test change (final pick vs initial pick). Runs are cached by
(task, split, program, carve) in `<root>/_pick_replay/runs.jsonl`, so a re-run resumes.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs.task import PREIMPORT  # noqa: E402
from rl4mle_jax import study  # noqa: E402
from rl4mle_jax.best_of_n import (  # noqa: E402
    FINALIST_K_SE,
    MAX_FINALISTS,
    code_key,
    finalists,
    pick_candidate,
    run_on_folds,
    runs_of,
    valid_boot,
    valid_score,
)
from rl4mle_jax.env.execute import default_sandbox  # noqa: E402
from rl4mle_jax.env.metrics import oriented_score  # noqa: E402
from rl4mle_jax.env.tasks import SELECT_CARVE, load_task, select_splits  # noqa: E402
from rl4mle_jax.run_config import PICK_RULES  # noqa: E402


def _key(task_id: str, split: str, code: str) -> str:
    # the carve: runs on another carve of the selection splits are not reused (carve 1's
    # cached runs, keyed without it, stay in the file unread)
    key = f"{task_id}\0{split}\0{code}\0carve{SELECT_CARVE}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class RunCache:
    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.rows[r["key"]] = r

    def add(self, row: dict[str, Any]) -> None:
        self.rows[row["key"]] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _fold_runs(fin: list[dict[str, Any]], task: Any, cache: RunCache, folds: list[str],
               ev: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """The finalists' selection runs, as `best_of_n.run_on_folds` keeps them
    ({code_key: {split: record}}): the evaluation's own (`ev["selection"]`, where made on this
    carve), else the cache's."""
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for c in fin:
        own = runs_of(ev, c["code"]) if ev is not None else {}
        for sp in folds:
            if own.get(sp) is not None:
                runs.setdefault(code_key(c["code"]), {})[sp] = own[sp]
                continue
            r = cache.rows.get(_key(task.id, sp, c["code"]))
            if r is not None:
                runs.setdefault(code_key(c["code"]), {})[sp] = {
                    "status": r["status"], "score": r["score"],
                    "grade": {"score_boot": r["score_boot"]}, "duration_s": r["duration_s"]}
    return runs


def _store(fin: list[dict[str, Any]], task: Any, cache: RunCache, folds: list[str],
           runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Appends the runs `run_on_folds` added to the cache."""
    for c in fin:
        for sp, rec in runs.get(code_key(c["code"]), {}).items():
            key = _key(task.id, sp, c["code"])
            if key not in cache.rows:
                cache.add({"key": key, "status": rec["status"], "score": rec["score"],
                           "score_boot": rec["grade"]["score_boot"],
                           "duration_s": rec["duration_s"]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--k-se", type=float, default=FINALIST_K_SE)
    ap.add_argument("--max-finalists", type=int, default=MAX_FINALISTS)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--no-run", action="store_true", help="tables from the cache only")
    ap.add_argument("--same-outcomes", action="store_true",
                    help="programs with identical reward-split runs each take a finalist's "
                         "place (before 2026-12-07: the default then)")
    ap.add_argument("--preimport", default=PREIMPORT,
                    help="modules the sandbox pre-imports (the default config's; '' starts "
                         "every program fresh)")
    ap.add_argument("--against", default=None, metavar="K_SE,MAX[,same]",
                    help="also pick with these finalists (e.g. '2,6,same': the setting before "
                         "2026-12-07) and compare each rule's two picks on test")
    args = ap.parse_args(argv)
    folds = select_splits(args.folds)
    dedup = not args.same_outcomes
    settings = [(args.k_se, args.max_finalists, dedup)]
    if args.against:
        a = args.against.split(",")
        try:
            if len(a) not in (2, 3) or a[2:] not in ([], ["same"]):
                raise ValueError
            settings.append((float(a[0]), int(a[1]), len(a) == 2))
        except ValueError:
            ap.error(f"--against: K_SE,MAX[,same] (e.g. 2,6,same), got {args.against!r}")
    sandbox = default_sandbox(preimport=args.preimport)
    per_run: list[dict[str, Any]] = []
    per_eval: list[dict[str, Any]] = []
    extra_runs = 0
    for root in map(Path, args.roots):
        cache = RunCache(root / "_pick_replay" / "runs.jsonl")
        for variant, runs in study.load_study(root).items():
            for run in runs:
                if not run.initial or not run.final or not run.config:
                    continue
                task = load_task(run.config["task"], run.config.get("data_root"))
                picks: dict[str, dict[str, Any]] = {}
                for tag, ev in (("initial", run.initial), ("final", run.final)):
                    d = ev.get("direction", task.direction)
                    fin = list({c["code"]: c for k, m, dd in settings[::-1]
                                for c in finalists(ev["candidates"], d, k, m, dd)}.values())
                    runs = _fold_runs(fin, task, cache, folds, ev)
                    todo = len(fin) * len(folds) - sum(len(v) for v in runs.values())
                    if todo and not args.no_run:
                        print(f"{root.name}/{variant}/seed{run.seed} {tag}: {todo} runs",
                              flush=True)
                        run_on_folds([c["code"] for c in fin], task, sandbox, folds, runs,
                                     concurrency=args.concurrency)
                        _store(fin, task, cache, folds, runs)
                    extra_runs += len(fin) * len(folds)
                    sel = {c["code"]: runs.get(code_key(c["code"]), {}) for c in fin}
                    row = {"root": root.name, "task": Path(str(run.config["task"])).name,
                           "variant": variant, "seed": run.seed, "eval": tag,
                           "direction": d, "finalists": len(fin), "same_as": _digest(ev)}
                    for i, (k, m, dd) in enumerate(settings):
                        for rule in PICK_RULES:
                            c = pick_candidate(ev["candidates"], d, rule, sel, folds, k, m, dd)
                            t = None if c is None else valid_score(c["test_split"])
                            row[rule + ("@against" if i else "")] = (
                                None if t is None else oriented_score(t, d),
                                None if c is None else valid_boot(c["test_split"]))
                    per_eval.append(row)
                    picks[tag] = row
                r = {"root": root.name, "variant": variant, "seed": run.seed}
                for rule in PICK_RULES:
                    (t0, b0), (t1, b1) = picks["initial"][rule], picks["final"][rule]
                    r[rule] = (None if t0 is None or t1 is None else t1 - t0,
                               study.paired_se(b0, b1))
                per_run.append(r)
    distinct = list({r["same_as"]: r for r in per_eval}.values())  # sweeps share initial evals
    print(f"\n{len(distinct)} distinct evaluations of {len(per_run)} runs; {extra_runs} "
          f"selection runs (finalists x folds)")
    for tag in ("initial", "final", None):
        print(f"\nEvaluations: {tag or 'all'}")
        print(_eval_table([r for r in distinct if tag in (None, r["eval"])]))
    if args.against:
        print(f"\nEach rule's pick with these finalists against its pick with {args.against}, "
              "all evaluations:")
        print(_eval_table(distinct, "@against"))
    print("\nBy task, all evaluations (rule against the reward split's maximum: evaluations where "
          "it picks another program, better / worse on test):")
    print(_task_table(distinct))
    print()
    print(_run_table(per_run))
    return 0


def _digest(ev: dict[str, Any]) -> str:
    """Same candidates, same records: the same evaluation (a sweep's variants share one)."""
    return hashlib.sha256(json.dumps([(c.get("code"), (c.get("reward_split") or {}).get("score"))
                                      for c in ev["candidates"]]).encode()).hexdigest()


def _z(diff: float, se: float | None) -> float:
    return 0.0 if abs(diff) < 1e-12 else (diff / se if se else float("nan"))


def _eval_table(rows: list[dict[str, Any]], against: str | None = None) -> str:
    """Per rule, its pick's test score against the reward-split maximum's (with `against`:
    against the same rule's pick with the other finalists, `rule + against`), evaluation by
    evaluation: how often it differs, is better or worse, and the mean paired z."""
    ref = "max" if against is None else f"the same rule{against}"
    lines = [f"| rule | evaluations | differs | better | worse | mean z vs {ref} (± s.e.) |",
             "|---|---|---|---|---|---|"]
    for rule in PICK_RULES:
        zs = []
        for r in rows:
            (a, ba), (b, bb) = r["max" if against is None else rule + against], r[rule]
            if a is None or b is None:
                continue
            zs.append(_z(b - a, study.paired_se(ba, bb)))
        z = np.asarray(zs, float)
        nz = z[z != 0]
        lines.append(f"| {rule} | {len(z)} | {len(nz)} | {(nz > 0).sum()} | {(nz < 0).sum()} | "
                     f"{np.nanmean(z):+.3f} ± {np.nanstd(z) / np.sqrt(max(len(z), 1)):.3f} |")
    return "\n".join(lines)


def _task_table(rows: list[dict[str, Any]]) -> str:
    rules = [r for r in PICK_RULES if r != "max"]
    lines = ["| task | evaluations | " + " | ".join(rules) + " |",
             "|---|---|" + "---|" * len(rules)]
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task and r["max"][0] is not None]
        cells = []
        for rule in rules:
            d = [r[rule][0] - r["max"][0] for r in mine if r[rule][0] is not None]
            cells.append(f"{sum(abs(x) > 1e-12 for x in d)}: {sum(x > 1e-12 for x in d)} / "
                         f"{sum(x < -1e-12 for x in d)}")
        lines.append(f"| {task} | {len(mine)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run_table(rows: list[dict[str, Any]]) -> str:
    """Per rule, the learning check's test change (final pick vs initial pick) over the runs."""
    lines = ["| rule | runs | worse | same | better | mean z of the change (± s.e.) |",
             "|---|---|---|---|---|---|"]
    for rule in PICK_RULES:
        g = [r[rule] for r in rows if r[rule][0] is not None]
        z = np.asarray([_z(d, se) for d, se in g], float)
        w = sum(d < -1e-12 for d, _ in g)
        b = sum(d > 1e-12 for d, _ in g)
        lines.append(f"| {rule} | {len(g)} | {w} | {len(g) - w - b} | {b} | "
                     f"{np.nanmean(z):+.3f} ± {np.nanstd(z) / np.sqrt(max(len(z), 1)):.3f} |")
    by_task: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_task[r["root"]].append(" ".join(
            f"{rule}:{'—' if r[rule][0] is None else f'{r[rule][0]:+.4g}'}" for rule in PICK_RULES))
    lines += ["", "Per run (test change, oriented so > 0 is better):"]
    lines += [f"- {k} · " + " | ".join(v) for k, v in by_task.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
