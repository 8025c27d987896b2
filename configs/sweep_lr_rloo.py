"""The actor learning rate under the leave-one-out default (issue 11), seeds 5-7.

configs/task.py's actor_lr 3e-5 was chosen under GAE with a critic (docs/sweep_tiny,
docs/sweep_updates), where lr 1e-4 collapsed one seed of three: the critic's errors pushed every
token of a batch the same way. Without a critic the batch's shared push is ~0, and the default's
per-step approx-KL is ~1e-5 with a PPO clip fraction of 0 on every step (docs/sweep_rloo's runs):
the policy moves far less per step than PPO allows. This measures 2x and 3.3x the step.

Measured (docs/sweep_lr_rloo/results.md, seeds 5-7, same draws as docs/sweep_rloo): batch
reward gain +1.16 (6e-5) and +1.24 (1e-4) against +1.26 at 3e-5, valid-rate gain +0.219 /
+0.250 against +0.229, test pick -0.0057 / -0.0166 against -0.0001: a larger step learns no
more and drifts to a reliably valid, weaker program (seed 5 at both rates). The default stays.

Launch (resumes; ~7-9 min per run on 2 cores; point it at the learning check's workdir to reuse
its initial draws, where the `rloo` variant of configs/sweep_rloo.py is the default):
  python experiments/sweep.py --config configs/sweep_lr_rloo.py --workdir workdirs/lc567
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "rloo_lr6e-5": (("learner.actor_lr", 6e-5),),
    "rloo_lr1e-4": (("learner.actor_lr", 1e-4),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
