"""The paper's setting: Qwen2.5-3B-Instruct, PPO, batch 128, lr 1e-5, clip 0.2, T = 0.7,
1024 prompt / 1024 response tokens, sharded over all devices (fsdp), one policy per task.

Overrides of configs/task.py only (temperature 0.7 and clip 0.2 are its values already).

Launch (on a TPU/GPU host; the checkpoint is read from a local directory, nothing downloads):
  python experiments/run.py --config configs/qwen2_5_3b.py:/path/to/Qwen2.5-3B-Instruct \
      --config.task=/path/to/mle-bench/data/random-acts-of-pizza --workdir workdirs/pizza
"""

import ml_collections

from configs import task as base


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base.get_config()
    c.model.hf_dir = arg or ""
    c.model.dtype = "bfloat16"
    c.warmstart.enabled = False
    c.prompt.max_prompt_tokens = 1024
    c.prompt.max_response_tokens = 1024
    c.sampling.prompt_buckets = (256, 512, 1024)
    c.sampling.batch_buckets = (1, 8, 16, 32, 64, 128)
    c.sampling.max_batch = 64
    c.instrument.max_new_tokens = 2048
    c.env.timeout_s = 300.0  # the paper's per-task default
    c.env.memory_mb = 16384
    c.learner.actor_lr = 1e-5
    # The paper's PPO: GAE with a separate critic (the CPU default's leave-one-out baseline
    # is for a critic that cannot learn within its 300 s; configs/task.py).
    c.learner.critic = "separate"
    c.learner.advantage_estimator = "gae"
    c.learner.group_size = 1
    c.learner.critic_lr = 1e-5
    # ... whitened, as GAE's advantages are in the paper's PPO (the CPU default leaves them
    # unwhitened), with no entropy term and the paper's reward alone (no rank bonus).
    c.learner.whiten_advantages = None  # the estimator's default: GAE whitens
    c.learner.entropy_coef = 0.0
    c.learner.entropy_gate = 0.0
    c.run.rank_bonus = 0.0
    # The paper's score, sign-flipped where lower is better (the CPU default's "auto" rescales
    # tasks whose baseline is large in its units; components warns where flipped would pay a
    # valid program less than a failure).
    c.reward.normalisation = "flipped"
    c.learner.num_minibatches = 4
    c.learner.micro_batch_size = 8
    c.learner.remat = True
    c.mesh.data = 1
    c.mesh.fsdp = -1  # all devices
    c.run.batch_size = 128
    c.run.slots = 128
    c.run.reuse_runs = 0  # every program runs, as in the paper
    c.run.time_budget_s = 24 * 3600.0
    c.run.max_steps = 100_000
    c.run.checkpoint_every = 10
    c.run.eval_samples = 128
    return c
