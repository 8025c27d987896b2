"""The frozen copy's instrumentation of a run's programs, verified exactly and with `realign`.

    .venv/bin/python scripts/replay_instrumentation.py --task /work/tasks/titanic-survival \
        --workdir workdirs/sweep_attention/default/seed5 --programs 40

Builds the run config's components (`configs/task.py` on `--task`; its warm start, from the
cache when it is there: the frozen copy is the initial policy), takes up to `--programs`
distinct programs of the run's `experience.jsonl` that reached the sandbox, asks the frozen copy
to instrument each (the loop's prompt, `instrument.max_new_tokens` and `instrument.temperature`,
one seeded batch) and verifies every answer twice: as the loop does by default (the answer must
be the program plus marker prints) and with `instrument.realign` (module docstring of
env/instrument_lm.py). Prints the outcome counts of each, the milestones an accepted answer
places, and how the realigned answers differed from their programs.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # configs/

from configs import task as task_config  # noqa: E402
from rl4mle_jax.components import build_components  # noqa: E402
from rl4mle_jax.env.instrument_lm import Instrumenter, verify_lm_instrumentation  # noqa: E402


def run_programs(workdir: Path, n: int) -> list[str]:
    """Up to n distinct programs of the run that were executed (instrumented), in order."""
    seen: dict[str, None] = {}
    for line in (workdir / "experience.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("code") and (e.get("record") or {}).get("exec_status"):
            seen.setdefault(e["code"], None)
    return list(seen)[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, help="a suite id or a task directory")
    ap.add_argument("--workdir", required=True, help="a run whose programs to instrument")
    ap.add_argument("--programs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = task_config.get_config(args.task)
    cfg.mesh.data = 1
    with tempfile.TemporaryDirectory() as tmp:
        comps = build_components(cfg, Path(tmp))
    tok = comps.tokenizer
    inst = Instrumenter("lm", chat_template=tok.apply_chat_template if tok.is_chat else None)
    codes = run_programs(Path(args.workdir), args.programs)
    if not codes:
        raise SystemExit(f"{args.workdir}/experience.jsonl holds no executed program")
    out = comps.sampler.generate(comps.params, [tok.encode(inst.prompt(c)) for c in codes],
                                 jax.random.key(args.seed),
                                 max_new_tokens=cfg.instrument.max_new_tokens,
                                 temperature=cfg.instrument.temperature)
    outcomes = {"exact": collections.Counter(), "realign": collections.Counter()}
    placed = {"exact": [], "realign": []}
    mismatches, shares = collections.Counter(), []
    for i, code in enumerate(codes):
        answer = tok.decode(out.tokens[i, :out.lengths[i]].tolist(), skip_special_tokens=True)
        for name, realign in (("exact", False), ("realign", True)):
            prog, rec = verify_lm_instrumentation(code, answer, realign)
            outcomes[name][("realigned" if rec.get("realigned") else "accepted")
                           if prog is not None else rec["reason"]] += 1
            placed[name].append(len(prog.milestones) if prog is not None else 0)
            if realign and rec.get("realigned"):
                mismatches[rec["mismatch"].split(" (")[0]] += 1
                shares.append(rec["aligned_share"])
    n = len(codes)
    print(f"task {comps.task.id}, {n} programs of {args.workdir}, frozen copy = the warm start, "
          f"max_new_tokens {cfg.instrument.max_new_tokens}, temperature "
          f"{cfg.instrument.temperature}")
    print("| verification | accepted as is | realigned | rejected (reasons) | "
          "milestones placed per program |")
    print("|---|---|---|---|---|")
    for name, c in outcomes.items():
        rejected = {k: v for k, v in c.items() if k not in ("accepted", "realigned")}
        print(f"| {name} | {c['accepted']} | {c['realigned']} | "
              f"{sum(rejected.values())} {dict(rejected)} | "
              f"{statistics.mean(placed[name]):.2f} |")
    if shares:
        print(f"realigned answers: statements paired {min(shares):.2f}-{max(shares):.2f} "
              f"(median {statistics.median(shares):.2f}); first differences: "
              f"{dict(mismatches.most_common(5))}")
    accept = {k: (c["accepted"] + c["realigned"]) / n for k, c in outcomes.items()}
    print(f"exact_accept_rate={accept['exact']:.3f} realign_accept_rate={accept['realign']:.3f}")


if __name__ == "__main__":
    main()
