"""SFT rescue in the loop (issue 16): configs/task.py from a warm start too weak to give PPO a
signal, with and without `rescue.enabled`.

The default's own warm start never triggers a rescue: in the nine learning-check runs of
configs/task.py (food-reviews and digits, seeds 2-4) every batch separated and the best of any
four consecutive batches stayed within 0.05 of the best demonstration (food-reviews >= 0.870 vs
0.874, digits >= 0.983 vs 0.993), so `rescue.enabled` would change nothing there. The rescue is
for a policy that does not yet write valid programs for a task (a new task, a weak start): here
the same warm start recipe stopped after `WEAK_STEPS` SFT steps instead of 240.

Launch (resumes; ~5 min per run on 2 cores):
  python experiments/sweep.py --config configs/rescue_check.py --workdir workdirs/rescue_check
"""

import ml_collections

from configs.sweep_base import sweep_config

WEAK_STEPS = 40  # SFT loss ~2.2 (240 steps: 0.04): code-like text that does not run
WEAK = (("warmstart.settings.steps", WEAK_STEPS),)

VARIANTS = {
    "weak": WEAK,
    "weak_rescue": WEAK + (("rescue.enabled", True),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = sweep_config(VARIANTS, seeds=(2, 3), arg=arg)
    c.base.run.time_budget_s = 180.0
    c.base.run.eval_samples = 16
    return c
