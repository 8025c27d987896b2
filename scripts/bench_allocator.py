"""The host allocator's effect on the train step: glibc malloc vs tcmalloc (vs jemalloc).

    .venv/bin/python scripts/bench_allocator.py                 # 2 rounds, 6 steps each
    .venv/bin/python scripts/bench_allocator.py --rounds 3 --steps 8 --modes bucket+fused

Each variant runs `scripts/bench_train_step.py --real` (the default run's learner step at its
real lengths) in its own process, the allocator chosen by RL4MLE_MALLOC / LD_PRELOAD, the
variants interleaved round by round so that a change in the machine's speed hits all of them.
It prints per variant the median step time, the process's user and system CPU seconds and its
minor page faults (from wait4's rusage), and each variant's step-time ratio to glibc.

Why (rl4mle_jax/allocator.py): XLA:CPU's large temporaries are mmap-ed and unmapped by glibc on
every step, so their pages fault in again each time; an allocator that keeps freed memory does
not pay that.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl4mle_jax.allocator import find_tcmalloc  # noqa: E402

_JEMALLOC = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/"
             "libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2")


def variants() -> dict[str, str]:
    """name -> RL4MLE_MALLOC value, for the allocators installed here."""
    out = {"glibc": "system"}
    tc = find_tcmalloc()
    if tc:
        out["tcmalloc"] = tc
    je = next((p for p in _JEMALLOC if os.path.exists(p)), None)
    if je:
        out["jemalloc"] = je
    return out


def run_one(choice: str, args: argparse.Namespace) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "RL4MLE_MALLOC_REEXEC")}
    env["RL4MLE_MALLOC"] = choice
    if choice != "system":
        env["LD_PRELOAD"] = choice
    cmd = [sys.executable, str(ROOT / "scripts/bench_train_step.py"), "--real", "--modes",
           args.modes, "--steps", str(args.steps)]
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"bench_train_step failed under {choice}: {err[-2000:]}")
    row = next((ln for ln in out.splitlines() if ln.strip().startswith(args.modes)), None)
    if row is None:
        raise RuntimeError(f"no {args.modes!r} row in bench_train_step's output:\n{out[-2000:]}")
    # columns: mode, shape, compile s, step s, s/episode, ratio, steps in 300 s
    step_s = float(re.split(r"\s+", row.strip())[3])
    return {"step_s": step_s, "wall_s": time.time() - t0}


def _child_faults() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="train steps per process (median)")
    ap.add_argument("--modes", default="bucket+fused", help="one bench_train_step --real mode")
    args = ap.parse_args()
    vs = variants()
    print(f"allocators: {', '.join(f'{k} ({v})' for k, v in vs.items())}; {args.rounds} rounds "
          f"x {args.steps} steps of the default run's train step ({args.modes}), one process "
          "each, interleaved", flush=True)
    res: dict[str, list[dict[str, float]]] = {k: [] for k in vs}
    for r in range(args.rounds):
        for name, choice in vs.items():
            before = os.times()
            faults0 = _child_faults()
            one = run_one(choice, args)
            after = os.times()
            one["user_s"] = after.children_user - before.children_user
            one["sys_s"] = after.children_system - before.children_system
            one["minflt"] = _child_faults() - faults0
            res[name].append(one)
            print(f"round {r + 1} {name:>9}: step {one['step_s']:.2f} s, process user "
                  f"{one['user_s']:.1f} s sys {one['sys_s']:.1f} s, minor faults "
                  f"{one['minflt'] / 1e6:.2f} M", flush=True)
    base = statistics.median(x["step_s"] for x in res["glibc"])
    header = (f"{'allocator':>9} {'step s':>7} {'user s':>7} {'sys s':>7} {'faults M':>9} "
              f"{'vs glibc':>9}")
    print(header)
    print("-" * len(header))
    for name, rows in res.items():
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        print(f"{name:>9} {med['step_s']:>7.2f} {med['user_s']:>7.1f} {med['sys_s']:>7.1f} "
              f"{med['minflt'] / 1e6:>9.2f} {base / med['step_s']:>8.2f}x")


if __name__ == "__main__":
    main()
