"""Advantages without per-batch whitening (issue 11).

With the default's GAE (gamma = lambda = 1, a critic that stays near 0 in 300 s:
docs/sweep_critic) the advantage is the episode's return whitened over the batch. Past the
first ~100 s about half of the batches hold no failure (docs/sweep_budget: the trained
batches' valid rate plateaus at ~0.88), and whitening turns their spread of validation scores
(AUC 0.83-0.87, often programs that differ by one hyper-parameter) into unit-variance
advantages: a full-size policy step on a 0.01-0.02 difference in score, as large as a step
that separates a failure (-10) from a valid program. This ran `whiten_advantages=False` (the
return minus the critic's value, unscaled; Adam's per-parameter normalisation still sets the
step size) against the default in one session, on the learning check's seeds and draws (copy
workdirs/sweep_anchor/_initial_evals into the workdir to reuse the initial draws).

Measured (docs/sweep_whiten/results.md, where the whitened rows are named `default`, the
default then): unwhitened gained more on every aggregate (valid rate +0.24 vs +0.21, batch
reward +2.36 vs +2.06, test pick +0.0011 on every seed vs 0), equal or better on each seed;
configs/task.py now sets whiten_advantages=False, so "unwhitened" below is the default and
"whitened" the configuration it replaced.

Launch (resumes; ~9 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_whiten.py --workdir workdirs/sweep_whiten
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "whitened": (("learner.whiten_advantages", True),),  # the default before 2026-12-04
    "unwhitened": (),  # configs/task.py
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(2, 3, 4), arg=arg)
