"""Rescaled valid rewards with unwhitened advantages (issue 11), on seeds 5-7. Not adopted.

The learning check of the unwhitened default on seeds 5-7 (workdirs/learning_check_s567) lifted
seed 5's valid rate by 0.28 but its test pick fell by 0.020: the policy settled on a reliable
program (unigrams, C=5; 0.859 on the reward split) and lost the warm start's best one (bigrams,
sublinear tf, C=10.5; 0.874). With the paper's reward a valid program earns its AUC (0.83-0.88)
against -10 for a failure, and without whitening nothing enlarges the 0.01-0.02 between valid
programs: the gradient sees failing vs not failing and almost nothing of better vs worse.
`reward.normalisation=rescaled` pays (score - baseline) / (strong - baseline) instead (food
reviews: baseline 0.8606, strong 0.8735, so 0.859 -> -0.15 and 0.874 -> +1.0), still against -10
for a failure: score differences weigh ~1/10 of a failure instead of ~1/1000. Measured earlier
with whitened advantages (README, Learner section): it kept the pick but raised the valid rate
less; whitening then also scaled the score spread up, so the two were not separable.

Measured (docs/sweep_rescaled/results.md): not adopted. It kept the test pick (-0.0003 vs
-0.0097) but the valid-rate gain fell to +0.08 (default +0.18) and the batch-reward gain to
+0.95 (+2.09).

Launch (resumes; ~9 min per run on 2 cores; copy workdirs/learning_check_s567/_initial_evals
and its default/ runs into the workdir to reuse the initial draws and the default's runs):
  python experiments/sweep.py --config configs/sweep_rescaled.py --workdir workdirs/sweep_rescaled
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "default": (),  # configs/task.py: raw AUC for a valid program, unwhitened advantages
    "rescaled": (("reward.normalisation", "rescaled"),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
