"""The critic once more, now that train steps hold most of the device lane (issue 11, point 1).

docs/sweep_tiny chose GAE with a separate critic when a run made ~19 learner steps and the lane
was mostly sampling; since the growing KV cache (261111c) the train steps take 131-159 s of the
300 s (docs/sweep_share), and half of each step is the critic's own trunk (forward and
backward over every token). The critic-free leave-one-out baseline over the batch
(`learner.critic=none`, `advantage_estimator=rloo`, `group_size=0`) drops that half. In
docs/sweep_tiny it raised the valid rate most but at lr 1e-4 collapsed onto a weaker program
(test pick -0.008); this runs it at the default's actor lr, 3e-5, with its advantages whitened
over the batch like GAE's (unwhitened, a batch with one -10 failure has advantages ~3x the unit
scale, so the same lr would take ~3x larger steps), on the learning check's seeds and initial
draws, against the default.

Measured at 23ffe71 (docs/sweep_critic/results.md, nothing else running): the separate critic
learned nothing in 300 s (values -0.18 against returns -1.5, explained variance <= 0.002 on
every step), so both variants trained on the same signal; without the critic's trunk the loop
made 40 / 41 / 39 steps against 31 / 31 / 29 but learned no more (reward gain +1.77 vs +2.20,
valid-rate gain +0.19 vs +0.22, pick +0 on every run): configs/task.py keeps the critic.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_critic.py --workdir workdirs/sweep_critic
"""

import ml_collections

from configs.sweep_base import sweep_config

RLOO = (("learner.critic", "none"), ("learner.advantage_estimator", "rloo"),
        ("learner.group_size", 0), ("learner.whiten_advantages", True))

VARIANTS = {
    "rloo_lr3e-5": RLOO,
    "gae_separate": (),  # configs/task.py
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
