"""The seeded reproduction study of the paper's claims: four variants × three seeds × two tasks,
equal wall-clock budgets per run.

Variants (configs/ablations.py): full, no duration weighting, no instrumentation, no
self-improvement. Tasks: the local task with the paper's fast-weak / slow-strong trade-off and
one text task. About 2¼ hours on a 2-core machine (24 runs × ~5.3 min, plus one initial
best-of-32 per task and seed, shared by the variants).

Launch (resumes: finished runs are skipped, interrupted ones resume from their checkpoints):
  python experiments/reproduce.py --config configs/reproduce.py --workdir workdirs/reproduce
"""

import ml_collections

from configs import ablations
from configs import task as base


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = base.get_config()
    c.base.run.time_budget_s = 200.0  # RL wall-clock per run, equal for every variant
    c.base.run.eval_samples = 32  # best-of-N before and after, same draws (the default)
    c.base.run.progress = False
    c.variants = ml_collections.ConfigDict(ablations.VARIANTS)
    c.seeds = (0, 1, 2)
    c.tasks = ("synthetic-tradeoff", "food-reviews")  # the trade-off task and a text task
    # Per-task overrides of the base: the trade-off task's data layout (24 float features in its
    # first-row preview) needs 604 prompt tokens before the description, over the default 512.
    c.task_overrides = ml_collections.ConfigDict({
        "synthetic-tradeoff": (("prompt.max_prompt_tokens", 1024),
                               ("sampling.prompt_buckets", (256, 512, 1024))),
    })
    c.docs_dir = "docs/reproduction"
    return c
