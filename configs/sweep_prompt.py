"""The prompt budget: an improve prompt that shows its whole parent (issue 11).

At the default's `prompt.max_prompt_tokens=512` the food-reviews solve prompt takes 482 tokens
(the description 227 of them), so an improve prompt has ~190 tokens left for the description
and the earlier program together; a valid program is ~206 tokens (median; 231 at most), and
`env.trim` keeps its imports and its tail, so the parent shown is `...  # [10 lines omitted]`
exactly where its model is defined (the vectorizer, the classifier: the lines an improvement
changes). The policy is asked for "the complete program" and must write those lines without
having seen them: in the last quarter of the default's runs most failures left are improve
candidates garbling them. At 704 tokens no parent of those runs is trimmed; at 768 the
description is whole too (763 tokens at most). The warm start renders its improve pairs with the
loop's prompt config, so this variant builds its own warm start (new initial draws).

Launch (resumes; ~3 min for the warm start, then ~8 min per run on 2 cores):
  python experiments/sweep.py --config configs/sweep_prompt.py --workdir workdirs/lc567
  python experiments/sweep.py --config configs/sweep_prompt.py:digits \
      --config.seeds="(2,3,4)" --workdir workdirs/lc_digits
"""

import ml_collections

from configs.sweep_base import sweep_config

VARIANTS = {
    "prompt768": (("prompt.max_prompt_tokens", 768), ("sampling.prompt_buckets", (256, 512, 768))),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config(VARIANTS, seeds=(5, 6, 7), arg=arg)
