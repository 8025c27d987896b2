"""A leave-one-out baseline over the batch, unwhitened, without a critic (issue 11), seeds 5-7.

The default's separate critic learns nothing in a 300 s run (docs/sweep_critic: values -0.18
against returns -1.5, explained variance <= 0.002), so its unwhitened GAE advantage R - V is
the raw return: a batch with one -10 failure among seven valid programs (AUC ~0.87) pushes the
tokens the eight share down by 7 x 0.87 - 10.9 ~ -4.8 per step, and a batch without a failure
pushes every sampled program up. The leave-one-out baseline (`advantage_estimator=rloo`,
`group_size=0`: each episode against the mean of the other seven) makes that push ~0 on shared
tokens, keeps the failure's -10 scale (no whitening) and drops the critic's half of every
train step (docs/sweep_critic: 40 steps instead of 30). Measured only whitened before
(docs/sweep_critic), where a batch's failures and its valid programs' 0.01 score differences
shared one unit scale. `rloo_rank` adds `run.rank_bonus=1`: without a failure in the batch,
leave-one-out leaves only the 0.01 differences, and the rank bonus gives the better program of
the batch an edge of up to 1 over the worse.

Measured (docs/sweep_rloo/results.md, where the `default` rows are the `gae_critic` runs, made
when that was configs/task.py): leave-one-out +1.26 / +0.229 / -0.0001 (batch reward, valid
rate, test pick) against +0.33 / +0.167 / -0.0005, 39-46 steps against 26-31; adopted in
configs/task.py. The rank bonus alone added nothing measurable (+1.11 / +0.240 / -0.0005); it is on
since 126ff0e, with entropy minimisation (configs/sweep_entropy.py).

Launch (resumes; ~9 min per run on 2 cores; point it at the learning check's workdir to reuse
its initial draws and default runs):
  python experiments/sweep.py --config configs/sweep_rloo.py --workdir workdirs/lc567
"""

import ml_collections

from configs.sweep_base import sweep_config

RLOO = (("learner.critic", "none"), ("learner.advantage_estimator", "rloo"),
        ("learner.group_size", 0), ("learner.whiten_advantages", False))
VARIANTS = {
    # The default before (GAE, gamma = lambda = 1, a separate critic, unwhitened).
    "gae_critic": (("learner.critic", "separate"), ("learner.advantage_estimator", "gae"),
                   ("learner.group_size", 1)),
    "rloo": RLOO,  # configs/task.py since
    "rloo_rank": RLOO + (("run.rank_bonus", 1.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
