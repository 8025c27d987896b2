"""How much of a sandboxed program's CPU time is its imports: the loop's programs, run whole and
as their import statements alone, through the loop's sandbox.

    .venv/bin/python scripts/bench_program_imports.py --task /work/tasks/titanic-survival \
        --workdir workdirs/sweep_attention/default/seed5 --programs 8 --repeats 3

Programs: up to `--programs` distinct valid programs of a run's `experience.jsonl` (evenly
spaced over the run), or without `--workdir` the built-in one below (the warm start's kind of
program). Each is run as given, as its top-level `import` / `from ... import` statements alone,
and a bare `pass`, in turn, `--repeats` times (a drift of the machine's speed hits all three
alike), on the task's reward split with the sandbox the loop uses (`env.execute.default_sandbox`:
bwrap when it works here, 1 core, the witness on) and the median kept. Prints per program the
CPU seconds (user + system, the program's own, as `ExecResult.cpu_s`) and wall seconds of each,
and the imports' share of the whole; the last line, machine-readable:
`imports_cpu_share=<median over programs> program_cpu_s=<median> imports_cpu_s=<median>`.

On a fast task this is what the loop's program CPU is: a fresh interpreter importing pandas and
scikit-learn (scikit-learn imports scipy.stats) for a fit of milliseconds.

`--forked` also measures what a pre-imported interpreter would save, *outside any sandbox*
(a measurement of the potential, not a way to run untrusted code): each program runs once in a
fresh `python -I` and once in a child forked from a helper interpreter that has already run
every program's imports (`runpy` in the child, cwd a scratch copy of the run dir), and the CPU
seconds of each are printed (`fresh_cpu_s=<median> forked_cpu_s=<median>`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rl4mle_jax.env.execute import default_sandbox
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


# The helper interpreter of --forked: runs the imports it is given, then for each run dir on
# stdin forks a child that runs ./program.py there and prints the child's CPU seconds.
_FORK_HELPER = r"""
import json, os, runpy, sys
exec(compile(sys.argv[1], "<imports>", "exec"), {})
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        os.chdir(line.strip())
        try:
            runpy.run_path("program.py", run_name="__main__")
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps([status, usage.ru_utime + usage.ru_stime]), flush=True)
"""


def _run_dir(root: Path, i: int, code: str, input_dir: Path) -> Path:
    d = root / f"run{i}"
    shutil.rmtree(d, ignore_errors=True)
    (d / "submission").mkdir(parents=True)
    (d / "input").symlink_to(input_dir)
    (d / "program.py").write_text(code)
    return d


def fresh_and_forked(codes: list[str], input_dir: Path) -> tuple[list[float], list[float]]:
    """CPU seconds of each program in a fresh interpreter and forked from a pre-imported one
    (no sandbox; 1 BLAS/OpenMP thread, as the sandbox sets for 1 core)."""
    env = {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                             "MKL_NUM_THREADS")}}
    fresh, forked = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, code in enumerate(codes):
            d = _run_dir(root, i, code, input_dir)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-I", "program.py"], cwd=d, env=env, check=True,
                           capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            fresh.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        imports = "".join(dict.fromkeys(import_prelude(c) for c in codes))
        dirs = "".join(f"{_run_dir(root, i, c, input_dir)}\n" for i, c in enumerate(codes))
        out = subprocess.run([sys.executable, "-I", "-c", _FORK_HELPER, imports], input=dirs,
                             env=env, text=True, capture_output=True, check=True).stdout
        for line in out.splitlines():
            status, cpu = json.loads(line)
            if status != 0:
                raise SystemExit("a forked program failed where its fresh run did not")
            forked.append(cpu)
    return fresh, forked


def measure(sandbox, code: str, input_dir: Path) -> tuple[float, float]:
    res = sandbox.run(code, input_dir)
    try:
        if res.status != "ok" or res.cpu_s is None:
            raise SystemExit(f"the program did not run cleanly ({res.status}): "
                             f"{(res.stderr or '')[-500:]}")
        return res.cpu_s, res.duration_s
    finally:
        res.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="food-reviews", help="a suite id or a task directory")
    ap.add_argument("--workdir", default="", help="a run whose valid programs to measure")
    ap.add_argument("--programs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--forked", action="store_true",
                    help="also: fresh interpreter vs forked from a pre-imported one (no sandbox)")
    args = ap.parse_args()
    task = load_task(args.task)
    input_dir = task.input_dir("reward")
    codes = run_programs(Path(args.workdir), args.programs) if args.workdir else [BUILTIN]
    sandbox = default_sandbox(timeout_s=300.0, cpus=1.0)
    print(f"task {task.id}, {len(codes)} program(s), median of {args.repeats} rounds, "
          f"sandbox {sandbox!r}")
    print("| program | whole CPU s | imports CPU s | `pass` CPU s | imports share | "
          "whole wall s | imports wall s |")
    print("|---|---|---|---|---|---|---|")
    shares, wholes, imports = [], [], []
    try:
        for i, code in enumerate(codes):
            variants = {"whole": code, "imports": import_prelude(code), "pass": "pass\n"}
            samples = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, src in variants.items():
                    samples[name].append(measure(sandbox, src, input_dir))
            cpu = {k: statistics.median(c for c, _ in v) for k, v in samples.items()}
            wall = {k: statistics.median(w for _, w in v) for k, v in samples.items()}
            share = cpu["imports"] / cpu["whole"]
            shares.append(share)
            wholes.append(cpu["whole"])
            imports.append(cpu["imports"])
            print(f"| {i} | {cpu['whole']:.2f} | {cpu['imports']:.2f} | {cpu['pass']:.2f} | "
                  f"{share:.2f} | {wall['whole']:.2f} | {wall['imports']:.2f} |", flush=True)
    finally:
        sandbox.close()
    print(f"imports_cpu_share={statistics.median(shares):.3f} "
          f"program_cpu_s={statistics.median(wholes):.3f} "
          f"imports_cpu_s={statistics.median(imports):.3f}")
    if args.forked:
        fresh, forked = fresh_and_forked(codes, input_dir)
        print("fresh interpreter CPU s: " + ", ".join(f"{x:.2f}" for x in fresh))
        print("forked, pre-imported CPU s: " + ", ".join(f"{x:.2f}" for x in forked))
        print(f"fresh_cpu_s={statistics.median(fresh):.3f} "
              f"forked_cpu_s={statistics.median(forked):.3f}")


if __name__ == "__main__":
    main()
