"""The prompt budget: an improve prompt that shows its whole parent (issue 11).

At the default's `prompt.max_prompt_tokens=512` the food-reviews solve prompt takes 482 tokens
(the description 227 of them), so an improve prompt has ~220 tokens left for the description
and the earlier program together; a valid program is ~206 tokens (median; 231 at most), and
`env.trim` keeps its imports and its tail: the parent shown is ~143 tokens, with
`...  # [9 lines omitted]` where it reads the data and builds the features (the vectorizer: one
of the two lines an improvement usually changes). The policy is asked for "the complete
program" and must write those lines without having seen them: in the last quarter of the
default's runs most failures left are improve candidates garbling a line. At 704 tokens no
valid parent of those runs is cut; at 768 the description is whole too (749 tokens at most).
The warm start renders its improve pairs with the loop's prompt config, so this variant builds
its own warm start (new initial draws).

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
