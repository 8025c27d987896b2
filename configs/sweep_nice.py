"""Sandboxed programs niced below the learner (issue 11, more learner steps): configs/task.py with
env.nice 0 (as before) against 10, on the learning check's seeds (2, 3, 4).

On 2 cores the device lane (train steps, policy sampling, the frozen copy's instrumentation) and
up to 8 sandboxed programs share the CPU. XLA's CPU kernels split work over both cores and wait
for the slower half, so a descheduled thread stalls the whole step: beside 6 bwrap programs the
default run's train step took 28.8 s at nice 0, 6.5 s at nice 10, 4.3 s alone
(scripts/bench_sandbox_nice.py; a niced run's cgroup gets the kernel's weight for its niceness,
since niceness inside a cgroup orders tasks only within it). The hypothesis: the lane is the
loop's serial path and programs fill its idle time, so niceness buys learner steps.

Measured (docs/sweep_nice/results.md): it did not. Steps 23.0 (default) vs 19.7 (nice 10),
batch-reward gain +1.58 vs +1.35, valid-rate gain +0.19 both: the programs' Δt rose (9.4 ->
13.2 s on seed 2), batches filled later, the loop is bound by its total CPU work. configs/task.py
keeps env.nice 0.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_nice.py --workdir workdirs/sweep_nice
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "default": (),  # env.nice 0, for a comparison within one run of the machine
    "nice10": (("env.nice", 10),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
