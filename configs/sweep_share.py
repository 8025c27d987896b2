"""The improve share and the step size at the current default (issue 11, points 2 and 3):
configs/task.py (12 slots, tcmalloc, logits from the responses) with three improve prompts in
four against one in two (a larger-lr variant was planned and dropped, below).

docs/sweep_updates measured improve_3in4 at 2569b13 with ~19 learner steps per 300 s: the best
batch-reward gain of that sweep (+2.21 over seeds 2-4) and the improve prompts' best-of-32
valid rate rising most (improve prompts fail most: syntax errors when editing a parent). The
default now makes ~26 steps (docs/sweep_slots); this asks whether the share still pays there.
Same seeds and initial draws as configs/learning_check.py; the default's runs at this tree are
docs/sweep_slots.

Measured at 82ce7b3 (docs/sweep_share/results_82ce7b3.md): improve_3in4 23 / 25 / 24 steps,
batch-reward gain +2.18 / +0.91 / +3.59 (mean +2.23), best-of-32 valid-rate gain +0.22 / +0.28 /
+0.19 (mean +0.23), pick +0, against the default's 23 / 28 / 26, +1.37, +0.19 (docs/sweep_slots).
Then the growing KV cache (sampling.cache_phase_tokens) roughly halved the sampler's decode
step; VARIANTS now compares the two shares at that tree, on the same seeds (the lr 5e-5 variant
was dropped before it ran, for the time).

Measured at 66ecdae, growing cache (docs/sweep_share/results.md): improve_3in4 28 / 32 / 28
steps, reward gain +1.99, valid gain +0.21; improve_half 28 / 27 / 29, +1.79, +0.21; pick +0
everywhere. Seed to seed the gains spread wider (+0.18 .. +3.30) than the shares differ, so
configs/task.py keeps the paper's one in two.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_share.py --workdir workdirs/sweep_share
"""

import ml_collections

from configs.sweep_base import sweep_config

IMPROVE_3IN4 = (("run.improve_prob", 0.75),)

VARIANTS = {
    "improve_3in4": IMPROVE_3IN4,
    "improve_half": (),  # configs/task.py's share until this sweep (the paper's)
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
