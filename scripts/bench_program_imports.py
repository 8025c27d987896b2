"""How much of a sandboxed program's CPU time is its imports: the loop's programs, run whole and
as their import statements alone, through the loop's sandbox.

    .venv/bin/python scripts/bench_program_imports.py --task /work/tasks/titanic-survival \
        --workdir workdirs/sweep_attention/default/seed5 --programs 8 --repeats 3

Programs: up to `--programs` distinct valid programs of a run's `experience.jsonl` (evenly
spaced over the run), or without `--workdir` the built-in one below (the warm start's kind of
program). Each is run as given, as its top-level `import` / `from ... import` statements alone,
and a bare `pass`, in turn, `--repeats` times (a drift of the machine's speed hits all three
alike), on the task's reward split in fresh interpreters (`env.execute.default_sandbox`: bwrap
when it works here, 1 core, the witness on; the loop itself now forks its programs from a
pre-imported one, the `--preimport` column) and the median kept. Prints per program the
CPU seconds (user + system, the program's own, as `ExecResult.cpu_s`) and wall seconds of each,
and the imports' share of the whole; the last line, machine-readable:
`imports_cpu_share=<median over programs> program_cpu_s=<median> imports_cpu_s=<median>`.

On a fast task this is what the loop's program CPU is: a fresh interpreter importing pandas and
scikit-learn (scikit-learn imports scipy.stats) for a fit of milliseconds.

`--preimport pandas,sklearn.ensemble,...` also runs each whole program through the same sandbox
with that `preimport` (programs forked from a pre-imported interpreter, env/sandbox/zygote.py),
interleaved with the fresh runs, and prints both the program's CPU seconds and the machine's:
all cores' busy time over the run from /proc/stat, which also counts bwrap, the launcher or
holder, and the zygote's fork (run it on an otherwise idle machine). Last line:
`fresh_machine_cpu_s=<median> zygote_machine_cpu_s=<median> ratio=<zygote/fresh>`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
from pathlib import Path

from rl4mle_jax.env.execute import default_sandbox
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import load_task

BUILTIN = '''import pandas as pd
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("./input/train.csv")
test = pd.read_csv("./input/test.csv")
features = [c for c in test.columns if c != "id"]
X = pd.get_dummies(train[features]).fillna(0)
X_test = pd.get_dummies(test[features]).reindex(columns=X.columns, fill_value=0).fillna(0)
target = [c for c in train.columns if c not in test.columns][0]
model = LogisticRegression(max_iter=1000).fit(X, train[target])
pd.DataFrame({"id": test["id"], target: model.predict(X_test)}).to_csv(
    "./submission/submission.csv", index=False)
'''


def import_prelude(code: str) -> str:
    """The program's top-level import statements, in order (what it loads before its work)."""
    tree = ast.parse(code)
    return "\n".join(ast.get_source_segment(code, node) for node in tree.body
                     if isinstance(node, (ast.Import, ast.ImportFrom))) + "\n"


def run_programs(workdir: Path, n: int) -> list[str]:
    """Up to n distinct valid programs of the run, evenly spaced in the order they finished."""
    seen, codes = set(), []
    for line in (workdir / "experience.jsonl").read_text().splitlines():
        e = json.loads(line)
        code = e.get("code")
        if (e.get("record") or {}).get("status") == "valid" and code and code not in seen:
            seen.add(code)
            codes.append(code)
    if not codes:
        raise SystemExit(f"{workdir}/experience.jsonl holds no valid program")
    step = max(len(codes) / n, 1.0)
    return [codes[int(i * step)] for i in range(min(n, len(codes)))]


def machine_busy_s() -> float:
    """All cores' busy seconds since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
    return busy / os.sysconf("SC_CLK_TCK")


def measure(sandbox, code: str, input_dir: Path) -> tuple[float, float, float]:
    """(the program's CPU s, its wall s, the machine's busy CPU s over the whole run)."""
    busy = machine_busy_s()
    res = sandbox.run(code, input_dir)
    busy = machine_busy_s() - busy
    try:
        if res.status != "ok" or res.cpu_s is None:
            raise SystemExit(f"the program did not run cleanly ({res.status}): "
                             f"{(res.stderr or '')[-500:]}")
        return res.cpu_s, res.duration_s, busy
    finally:
        res.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="food-reviews", help="a suite id or a task directory")
    ap.add_argument("--workdir", default="", help="a run whose valid programs to measure")
    ap.add_argument("--programs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preimport", default="",
                    help="also: each program forked from an interpreter that imported these")
    args = ap.parse_args()
    task = load_task(args.task)
    input_dir = task.input_dir("reward")
    codes = run_programs(Path(args.workdir), args.programs) if args.workdir else [BUILTIN]
    sandbox = default_sandbox(timeout_s=300.0, cpus=1.0)
    zygote = None
    if args.preimport:
        zygote = Sandbox("bwrap", timeout_s=300.0, cpus=1.0, preimport=args.preimport)
    print(f"task {task.id}, {len(codes)} program(s), median of {args.repeats} rounds, "
          f"sandbox {sandbox!r}" + (f", preimport {args.preimport}" if zygote else ""))
    print("| program | whole CPU s | imports CPU s | `pass` CPU s | imports share | "
          "whole wall s | imports wall s | whole machine CPU s |"
          + (" zygote CPU s | zygote wall s | zygote machine CPU s |" if zygote else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if zygote else ""))
    shares, wholes, imports, fresh_busy, zygote_busy = [], [], [], [], []
    try:
        for i, code in enumerate(codes):
            variants = {"whole": (sandbox, code), "imports": (sandbox, import_prelude(code)),
                        "pass": (sandbox, "pass\n")}
            if zygote is not None:
                variants["zygote"] = (zygote, code)
            samples = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, (box, src) in variants.items():
                    samples[name].append(measure(box, src, input_dir))
            cpu, wall, busy = ({k: statistics.median(s[j] for s in v) for k, v in samples.items()}
                               for j in range(3))
            share = cpu["imports"] / cpu["whole"]
            shares.append(share)
            wholes.append(cpu["whole"])
            imports.append(cpu["imports"])
            fresh_busy.append(busy["whole"])
            row = (f"| {i} | {cpu['whole']:.2f} | {cpu['imports']:.2f} | {cpu['pass']:.2f} | "
                   f"{share:.2f} | {wall['whole']:.2f} | {wall['imports']:.2f} | "
                   f"{busy['whole']:.2f} |")
            if zygote is not None:
                zygote_busy.append(busy["zygote"])
                row += f" {cpu['zygote']:.2f} | {wall['zygote']:.2f} | {busy['zygote']:.2f} |"
            print(row, flush=True)
    finally:
        sandbox.close()
        if zygote is not None:
            zygote.close()
    print(f"imports_cpu_share={statistics.median(shares):.3f} "
          f"program_cpu_s={statistics.median(wholes):.3f} "
          f"imports_cpu_s={statistics.median(imports):.3f}")
    if zygote is not None:
        f, z = statistics.median(fresh_busy), statistics.median(zygote_busy)
        print(f"fresh_machine_cpu_s={f:.3f} zygote_machine_cpu_s={z:.3f} ratio={z / f:.3f}")


if __name__ == "__main__":
    main()
