"""Hyper-parameters of the tiny warm-started model, chosen by measurement (issue 11, point 2).

The paper's setting (actor lr 1e-5, GAE with a separate critic) is for 3B parameters; the tiny
model has 1.3M and was fine-tuned at lr 3e-3. Each variant is a set of overrides of
configs/task.py, run over several seeds with the default 300 s RL budget and a best-of-32
evaluation before and after (same draws).

Launch (resumes; ~8 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_tiny.py --workdir workdirs/sweep_tiny
"""

import ml_collections

from configs import task as base

# Critic-free leave-one-out baseline over the whole batch (every row one group).
RLOO = (("learner.critic", "none"), ("learner.advantage_estimator", "rloo"))

VARIANTS = {
    "rloo_lr3e-4": RLOO + (("learner.actor_lr", 3e-4), ("learner.group_size", 8)),
    "rloo_lr1e-4": RLOO + (("learner.actor_lr", 1e-4), ("learner.group_size", 8)),
    "rloo_lr3e-4_b4": RLOO + (("learner.actor_lr", 3e-4), ("learner.group_size", 4),
                              ("run.batch_size", 4)),
    "gae_lr3e-5": (),  # the default before this sweep
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.base = base.get_config()
    c.base.run.eval_samples = 32
    c.base.run.progress = False
    c.variants = ml_collections.ConfigDict(VARIANTS)
    c.seeds = (0, 1)
    return c
