"""What niceness of the sandboxed programs buys the learner on a shared CPU (env.nice).

    .venv/bin/python scripts/bench_sandbox_nice.py                 # nice 0, 5, 10, 19; 6 programs
    .venv/bin/python scripts/bench_sandbox_nice.py --programs 8 --nice 0,10 --steps 4

The default run's train step (scripts/bench_train_step.py --real, bucket+fused: batch 8 at the
real lengths) runs --steps times while --programs sandboxed programs (bwrap, as the loop runs
them; each a single-threaded numpy loop of ~1 CPU-s) are kept in flight, one condition after
another, interleaved over --rounds rounds. Printed per condition: the median train-step time,
its ratio to the step alone, and programs finished per minute during the steps. Both are the
loop's work: the train step is its serial path (sampling waits for it), the programs its
parallel one. Compilation is a warm-up, not timed. Ratios compare within one run only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_train_step as bts  # noqa: E402

from configs import task as task_config  # noqa: E402
from rl4mle_jax import models  # noqa: E402
from rl4mle_jax import sharding as shd  # noqa: E402
from rl4mle_jax.env.sandbox import Sandbox  # noqa: E402
from rl4mle_jax.rl.learner import make_learner  # noqa: E402
from rl4mle_jax.rl.learner_config import LearnerConfig  # noqa: E402
from rl4mle_jax.rollout.collate import build_batch  # noqa: E402
from rl4mle_jax.warmstart.config import WarmStartConfig  # noqa: E402

PROGRAM = """
import numpy as np
a = np.random.default_rng(0).random((150, 150))
for _ in range({iters}):
    a = np.tanh(a @ a)
print("ok")
"""


class Programs:
    """Keeps `n` sandboxed programs in flight (one thread each) until stopped; counts the done."""

    def __init__(self, sandbox: Sandbox, n: int, code: str, input_dir: Path):
        self.sb, self.code, self.input_dir = sandbox, code, input_dir
        self.done, self.errors = 0, []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            res = self.sb.run(self.code, self.input_dir)
            res.cleanup()
            with self.lock:
                if res.status == "ok":
                    self.done += 1
                else:
                    self.errors.append(res.status)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nice", default="0,5,10,19", help="niceness values to compare")
    ap.add_argument("--programs", type=int, default=6, help="programs kept in flight")
    ap.add_argument("--steps", type=int, default=4, help="train steps per condition")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--backend", default="bwrap", help="sandbox backend")
    args = ap.parse_args()

    cfg = task_config.get_config()
    c = models.get_preset(WarmStartConfig().preset, vocab_size=WarmStartConfig().vocab_size)
    learner = make_learner(c, LearnerConfig.from_dict(cfg.learner), shd.make_mesh())
    state = learner.init_state(learner.shard_params(models.init_params(c, jax.random.PRNGKey(0))),
                               jax.random.PRNGKey(1))
    p_max, r_max = cfg.prompt.max_prompt_tokens, cfg.prompt.max_response_tokens
    arrays = build_batch(bts.real_experiences(c, 8, 480, 265, p_max, r_max), p_max, r_max, 0,
                         length_bucket=cfg.run.length_bucket)

    def step() -> float:
        nonlocal state
        t = time.perf_counter()
        state, metrics = learner.train_step(state, dict(arrays))
        jax.block_until_ready(metrics)
        return time.perf_counter() - t

    step()  # compiles
    input_dir = Path(tempfile.mkdtemp(prefix="bench_nice_input_"))
    input_dir.chmod(0o755)  # the sandbox's uid reads it
    # one program's size: ~1 CPU-s, measured alone
    probe = Sandbox(args.backend, timeout_s=120, memory_mb=2048)
    t = time.perf_counter()
    res = probe.run(PROGRAM.format(iters=200), input_dir)
    assert res.status == "ok", res.stderr
    iters = max(20, int(200 / max(res.duration_s, 1e-3)))
    code = PROGRAM.format(iters=iters)
    res.cleanup()
    print(f"train step: batch {arrays['tokens'].shape}, {len(jax.devices())} × "
          f"{jax.devices()[0].platform}; programs: {args.programs} in flight, {iters} numpy "
          f"iterations (~1 CPU-s alone; probe {time.perf_counter() - t:.1f} s), backend "
          f"{args.backend}")

    conds = ["alone"] + [int(n) for n in args.nice.split(",")]
    steps: dict = {k: [] for k in conds}
    rates: dict = {k: [] for k in conds}
    for _ in range(args.rounds):
        for cond in conds:
            if cond == "alone":
                steps[cond] += [step() for _ in range(args.steps)]
                continue
            sb = Sandbox(args.backend, timeout_s=300, memory_mb=2048, nice=cond)
            with Programs(sb, args.programs, code, input_dir) as progs:
                time.sleep(1.0)  # let them start
                t0, done0 = time.perf_counter(), progs.done
                steps[cond] += [step() for _ in range(args.steps)]
                rates[cond].append((progs.done - done0) * 60 / (time.perf_counter() - t0))
            if progs.errors:
                print(f"nice {cond}: {len(progs.errors)} programs failed: {progs.errors[:3]}")
    alone = float(np.median(steps["alone"]))
    header = f"{'programs':>16} {'step s':>7} {'vs alone':>9} {'programs/min':>13}"
    print(header)
    print("-" * len(header))
    for cond in conds:
        s = float(np.median(steps[cond]))
        label = "none (alone)" if cond == "alone" else f"nice {cond}"
        rate = f"{np.median(rates[cond]):>13.1f}" if rates[cond] else f"{'-':>13}"
        print(f"{label:>16} {s:>7.2f} {s / alone:>8.2f}× {rate}")
    print(f"median of {args.rounds} × {args.steps} steps per condition, interleaved")


if __name__ == "__main__":
    main()
