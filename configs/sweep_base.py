"""A sweep over configs/task.py: its variants (tuples of (key, value) overrides) x seeds.

experiments/sweep.py reads `base`, `variants`, `seeds` and optionally `variant_seeds`
(variant -> its own seeds). The sweep configs (learning_check, sweep_tiny, sweep_improve,
sweep_updates) are this with their own variants and seeds.
"""

import ml_collections

from configs import task as base


def sweep_config(variants: dict, seeds: tuple[int, ...], arg: str | None = None,
                 variant_seeds: dict | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = base.get_config(arg)  # arg: a task id or directory, as configs/task.py takes
    c.base.run.progress = False
    c.variants = ml_collections.ConfigDict(variants)
    c.seeds = tuple(seeds)
    if variant_seeds:
        c.variant_seeds = ml_collections.ConfigDict(dict(variant_seeds))
    return c
