"""The warm start's spread between builds (experiments/warmstart_spread.py): SFT variants x
build seeds (warmstart.settings.seed) x tasks, each build judged by its own best-of-N draw.

  python experiments/warmstart_spread.py \
      --config configs/warmstart_spread.py:diamonds-cut,/work/tasks/titanic-survival \
      --workdir workdirs/ws_spread

arg: comma-separated task ids or directories (default diamonds-cut,tweet-source).
"""

import ml_collections

from configs import task as base


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = base.get_config()
    c.base.run.progress = False
    c.tasks = arg or "diamonds-cut,tweet-source"
    c.seeds = (0, 1, 2)
    c.eval_samples = 32  # a build at 0.5 valid: +-0.09 (binomial sd) from the draw alone
    c.eval_seed = 0
    # warmstart.settings overrides. "average": the weights averaged over the last quarter of
    # the schedule (SWA); "slow": twice the steps at a third of the peak learning rate;
    # "low_lr": that rate at the default's steps; "edits": improve pairs that change one
    # setting of their parent (edit_pairs_per_task).
    c.variants = ml_collections.ConfigDict({
        "default": {},
        "average": {"average_last": 0.25},
        "slow": {"learning_rate": 1e-3, "steps": 480},
        "low_lr": {"learning_rate": 1e-3},
        "edits": {"edit_pairs_per_task": 6},
    })
    # Builds whose improve answers are judged too: `improve_parents` valid demonstrations as
    # parents, `improve_per_parent` answers to each one's improve prompt, run and compared.
    c.improve_variants = ("default", "edits")
    c.improve_parents = 4
    c.improve_per_parent = 8
    return c
