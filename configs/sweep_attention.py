"""Causal attention in chunks of 128 query rows (learner.attention_chunk, the default since
this sweep) against one [T, T] block per layer (attention_chunk=0, the earlier default): learner
steps per 300 s and what they learn (issue 11, point 1).

The chunks give the same values up to float rounding (tests/models/test_qwen2.py) and made the
train step alone ~2x faster (scripts/bench_train_step.py --real --modes one-block,default);
this measures what that buys in the loop, where the step shares 2 cores with the sandboxed
programs and the lane with sampling. Only the learner's attention differs: the sampler's prefill
attends in chunks in both variants. Both run seed by seed in one process, on the same warm start
and initial draws as configs/learning_check.py's titanic-survival seeds 5-7.

Launch (resumes; ~8.5 min per run on 2 cores):
  python scripts/make_task_dir.py titanic-survival /work/tasks/titanic-survival
  python experiments/sweep.py --config configs/sweep_attention.py:/work/tasks/titanic-survival \\
      --workdir workdirs/sweep_attention
"""

import ml_collections

from configs.sweep_base import sweep_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return sweep_config({"one_block": (("learner.attention_chunk", 0),), "default": ()},
                        seeds=(5, 6, 7), arg=arg)
