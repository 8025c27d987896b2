"""Step size with and without an anchor to the warm start (issue 11).

The default (actor lr 3e-5) learns but moves little in 300 s: its best-of-32 valid-rate gain
stays at ~0.2 over seeds 2-4 in every session (docs/sweep_credit, docs/sweep_critic), and the
final policy often keeps an initial failure at the same draw. lr 1e-4 moves it more but
destabilised one seed of three in each form tried (docs/sweep_updates, docs/sweep_credit).
This runs, on the learning check's seeds and in one session (the machine's speed varies
between sessions): the default; a step in between (5e-5); and lr 1e-4 held near the warm start
by a KL term in the loss (k3, coefficient 0.2, the reference is the warm start the run began
from).

Measured at 45e20f7, when configs/task.py whitened GAE's advantages (its default since
is unwhitened: docs/sweep_whiten), so a rerun's variants differ from the page's in that.

Launch (resumes; ~10 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_anchor.py --workdir workdirs/sweep_anchor
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "default": (),  # configs/task.py
    "lr5e-5": (("learner.actor_lr", 5e-5),),
    "kl_lr1e-4": (("learner.actor_lr", 1e-4), ("learner.kl_mode", "loss"),
                     ("learner.kl_coef", 0.2)),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
