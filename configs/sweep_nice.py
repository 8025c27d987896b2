"""Sandboxed programs niced below the learner (issue 11, more learner steps): configs/task.py with
env.nice 0 (as before) against 10, on the learning check's seeds (2, 3, 4).

On 2 cores the device lane (train steps, policy sampling, the frozen copy's instrumentation) and
up to 8 sandboxed programs share the CPU. XLA's CPU kernels split work over both cores and wait
for the slower half, so a descheduled thread stalls the whole step: with 6 single-threaded
numpy loops beside it a train step of the default run took 16.0 s at nice 0 against 3.9 s alone,
5.4 s at nice 10 (scripts/bench_sandbox_nice.py). The lane is the loop's serial path; programs
are parallel and fill the lane's idle time, so niceness should buy learner steps without
losing episodes.

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
