"""Ablations of the paper (full, no duration weighting, no instrumentation, no self-improvement),
as config overrides of configs/task.py, each over several seeds.

Launch:
  python experiments/sweep.py --config configs/ablations.py --workdir workdirs/ablations
"""

import ml_collections

from configs import task as base

# Each variant: (dotted key, value) overrides of the base config.
VARIANTS = {
    "full": (),
    "no_duration_weighting": (("learner.duration_weighting", "off"),),
    "no_instrumentation": (("instrument.mode", "none"),),
    "no_self_improvement": (("run.improve_prob", 0.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = base.get_config()
    c.base.run.time_budget_s = 240.0
    c.base.run.eval_samples = 8
    c.base.run.progress = False
    c.variants = ml_collections.ConfigDict(VARIANTS)
    c.seeds = (0, 1)
    return c
