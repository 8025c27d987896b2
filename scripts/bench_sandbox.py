"""Sandbox benchmark: overhead per execution, and throughput of N concurrent executions.

    python scripts/bench_sandbox.py [--repeats 10] [--concurrency 1,2,4,8]
                                    [--backends bwrap,subprocess]

Overhead = median wall-clock of `Sandbox.run("pass")` minus the median of a bare
`python -c pass` with the same interpreter. Throughput runs rounds of N copies of a short
CPU-bound program at once (asyncio.gather over `Sandbox.arun`) and reports executions per
second and the mean Δt each program measured for itself (Δt grows once N exceeds the cores,
which is what the duration-aware gradient must account for). The "limits" column names how the
run's aggregate limits were enforced (cgroup v2 / cgroup v1 / watchdog; tmpfs run dir as root).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rl4mle_jax.env.sandbox import Sandbox

CPU_PROGRAM = "s = 0\nfor i in range(2_000_000):\n    s += i * i\nprint(s)\n"


def _median_ms(xs: list[float]) -> float:
    return 1000 * statistics.median(xs)


def bare_python(python: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([python, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return times


def sandbox_pass(sb: Sandbox, input_dir: Path, repeats: int) -> tuple[list[float], list[float]]:
    """(wall-clock per call, Δt the program measured) over `repeats` calls."""
    sb.run("pass", input_dir).cleanup()  # warm-up (first call checks the sandbox works)
    walls, dts = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        res = sb.run("pass", input_dir)
        walls.append(time.perf_counter() - t)
        dts.append(res.duration_s)
        assert res.status == "ok", res.stderr
        res.cleanup()
    return walls, dts


def throughput(sb: Sandbox, input_dir: Path, n: int, rounds: int) -> tuple[float, float, float]:
    """(executions per second, mean Δt in s, wall per round in s) for n at a time."""

    async def one_round():
        return await asyncio.gather(*[sb.arun(CPU_PROGRAM, input_dir) for _ in range(n)])

    t = time.perf_counter()
    dts = []
    for _ in range(rounds):
        for res in asyncio.run(one_round()):
            assert res.status == "ok", res.stderr
            dts.append(res.duration_s)
            res.cleanup()
    wall = time.perf_counter() - t
    return n * rounds / wall, statistics.mean(dts), wall / rounds


def _configs(backends: list[str]) -> list[tuple[str, str]]:
    """(backend, interpreter) pairs. The subprocess backend drops to an unprivileged uid only
    with an interpreter that uid can run (the venv's pyenv Python under /root, mode 700, is not
    one), so as root it uses the system Python; bwrap runs with both, so the two backends are
    compared on the same interpreter (pyenv's build is slower than Debian's optimised one)."""
    system = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    out = []
    for backend in backends:
        if backend == "bwrap":
            out.append(("bwrap", sys.executable))
            if system != sys.executable:
                out.append(("bwrap", system))
        elif backend == "subprocess" and os.geteuid() == 0:
            out.append(("subprocess", system))
        else:
            out.append((backend, sys.executable))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per concurrency level")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--backends", default="bwrap,subprocess")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    input_dir = Path(tempfile.mkdtemp(prefix="bench_sandbox_in_"))
    os.chmod(input_dir, 0o755)  # the sandbox's unprivileged uid must be able to read it
    (input_dir / "train.csv").write_text("id,x\n1,2\n")
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f} "
          f"(other work on the machine inflates every number)")
    rows = []
    try:
        for backend, python in _configs(args.backends.split(",")):
            sb = Sandbox(backend=backend, timeout_s=120, python=python, max_concurrency=max(levels))
            bare = bare_python(python, args.repeats)
            walls, dts = sandbox_pass(sb, input_dir, args.repeats)
            tp = {n: throughput(sb, input_dir, n, args.rounds) for n in levels}
            mech = getattr(sb._backend, "mechanism", "?")
            rows.append((backend, python, mech, _median_ms(bare), _median_ms(walls),
                         _median_ms(dts), tp))
            sb.close()
    finally:
        shutil.rmtree(input_dir, ignore_errors=True)

    print(f"\nOverhead per execution (median of {args.repeats}):")
    print("| backend | interpreter | limits | bare `python -c pass` ms | sandbox run('pass') ms "
          "| overhead ms | program Δt ms |")
    print("|---|---|---|---|---|---|---|")
    for backend, python, mech, bare, wall, dt, _ in rows:
        print(f"| {backend} | {python} | {mech} | {bare:.0f} | {wall:.0f} | {wall - bare:.0f} "
              f"| {dt:.0f} |")
    print(f"\nThroughput of N concurrent CPU-bound programs ({args.rounds} rounds each; "
          f"each program ~2M-iteration Python loop):")
    print("| backend | interpreter | N | executions/s | wall per round s | mean Δt s |")
    print("|---|---|---|---|---|---|")
    for backend, python, _, _, _, _, tp in rows:
        for n, (eps, mean_dt, per_round) in tp.items():
            print(f"| {backend} | {python} | {n} | {eps:.2f} | {per_round:.2f} | {mean_dt:.2f} |")


if __name__ == "__main__":
    main()
