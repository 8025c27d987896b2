"""What moves the default's learning (issue 11, points 2 and 3): PPO epochs, learning rate, and
the improve share.

The default (one update of lr 3e-5 per batch of 8) leaves the warm-started model nearly where it
started (approx-KL per step ~1e-6 .. 1e-4, token entropy 0.04): with Adam each update moves a
weight by about lr, so ~25 updates move logits by a fraction of a nat. Two ways to move further:
several PPO updates per batch (the clipped ratio bounds how far one batch can pull), or a larger
lr with one update. And a third knob: configs/sweep_improve.py found the best-of-32 valid-rate
gain growing with the improve share (0 < 0.25 < 0.5, seeds 0 and 1); 0.75 continues that line.
Run on the learning check's seeds, against its numbers for the default (configs/learning_check.py,
docs/learning_check/results_v3.md).

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_updates.py --workdir workdirs/sweep_updates
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    # 2 epochs x 2 minibatches of 4: four clipped updates per batch at the default lr
    "epochs2_mb2": (("learner.ppo_epochs", 2), ("learner.num_minibatches", 2)),
    # one update per batch, 3.3x the default actor lr
    "lr1e-4": (("learner.actor_lr", 1e-4),),
    # three improve prompts in four (the default: one in two)
    "improve_3in4": (("run.improve_prob", 0.75),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
