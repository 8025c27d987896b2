"""Score ranking among a batch's valid episodes (`run.rank_bonus`, issue 11), on seeds 5-7.

With the paper's reward a valid program earns its AUC (0.83-0.88 on food-reviews) against -10
for a failure. Unwhitened, the 0.01-0.02 between valid programs weighs ~1/1000 of a failure and
the policy can settle on a reliable, weaker program: on seed 5 the default's final pick fell
from the warm start's best (0.874 on the reward split) to 0.859, test -0.020
(docs/learning_check/results_s567.md). The two ways tried to give the score more weight mixed
it into the failure-vs-valid scale: whitening z-scores the whole batch (a batch without a
failure gets unit-size steps on noise-level differences; with one, the failure's step shrinks
~4x), and rescaled rewards ((score - baseline) / (strong - baseline)) pay a weak valid program
less than nothing (0.83 -> -2.4): both kept the pick and gained less validity.

`run.rank_bonus=c` keeps the paper's reward and adds, to each valid row of a learner batch,
c x its centred rank among the batch's valid rows (in [-c/2, c/2], zero-sum): the failures' and
the valid rows' mean rewards are unchanged, a better valid program beats a worse one by at most
c whatever the metric's scale, and ties (the same program) get the same share.

Launch (resumes; ~9 min per run on 2 cores; point it at the learning check's workdir to reuse
its initial draws and default runs):
  python experiments/sweep.py --config configs/sweep_rank.py --workdir workdirs/lc567
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "default": (),  # configs/task.py: raw AUC for a valid program, unwhitened advantages
    "rank_half": (("run.rank_bonus", 0.5),),
    "rank_1": (("run.rank_bonus", 1.0),),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
