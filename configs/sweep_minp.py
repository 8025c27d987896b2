"""Min-p truncation of the policy's sampling, with the same truncation in the learner (issue 11).

Under the leave-one-out default most failures left in the last quarter of a run are syntax
errors from single garbled tokens (`max_iter= random_state=1.0`, an unmatched bracket): tokens
the policy gives a small probability that temperature 0.7 still draws now and then, and that
the sequence-level reward can push down only slowly, one garble at a time. Min-p sampling
(Nguyen et al. 2024) drops every token whose probability is below min_p times the most likely
one's; the learner truncates its logits the same way (LearnerConfig.min_p), so PPO's ratio is
still between the distributions the tokens were drawn from. The evaluations (best-of-32 before
and after) sample with the same truncation, so their initial draws are not the default's.

Launch (resumes; ~7-9 min per run on 2 cores; in the learning check's workdir the `rloo`
variant of configs/sweep_rloo.py is the default on the same seeds and warm start):
  python experiments/sweep.py --config configs/sweep_minp.py --workdir workdirs/lc567
  python experiments/sweep.py --config configs/sweep_minp.py:digits \
      --config.seeds="(2,3,4)" --workdir workdirs/lc_digits
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "min_p_0p1": (("sampling.min_p", 0.1), ("learner.min_p", 0.1)),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
