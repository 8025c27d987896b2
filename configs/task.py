"""The embedded CPU default: the tiny Qwen2-architecture model on one local task, in minutes.

With no checkpoint given, the policy is the cached warm start (a byte-level BPE tokenizer and a
tiny Qwen2 fine-tuned on real, executed solution programs for the task), then PPO with all three
ideas on: duration-aware gradients, LM instrumentation by the frozen copy, self-improvement.

Launch:
  python experiments/run.py --config configs/task.py --workdir workdirs/task
  python experiments/run.py --config configs/task.py --config.task=food-reviews \
      --config.run.time_budget_s=300 --workdir workdirs/food
"""

import dataclasses

import ml_collections

from rl4mle_jax.warmstart import WarmStartConfig


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.task = arg or "food-reviews"  # a local task id (python -m rl4mle_jax.env list) or a dir
    c.data_root = ""  # default: $RL4MLE_DATA or ~/.cache/rl4mle_jax/tasks

    c.model = ml_collections.ConfigDict()
    c.model.hf_dir = ""  # a local Hugging Face directory; empty: the warm-started tiny model
    c.model.dtype = "float32"

    c.warmstart = ml_collections.ConfigDict()
    c.warmstart.enabled = True
    c.warmstart.cache_dir = ""  # default: $RL4MLE_WARMSTART or ~/.cache/rl4mle_jax/warmstart
    # rl4mle_jax.warmstart.WarmStartConfig, every field (token limits follow c.prompt).
    c.warmstart.settings = ml_collections.ConfigDict({
        k: v for k, v in dataclasses.asdict(WarmStartConfig()).items()
        if k not in ("max_prompt_tokens", "max_response_tokens")})

    c.prompt = ml_collections.ConfigDict()
    c.prompt.max_prompt_tokens = 512  # fits the prompt of every local task
    c.prompt.max_response_tokens = 768

    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 0.7  # the paper's
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    c.sampling.prompt_buckets = (256, 512)
    c.sampling.batch_buckets = (1, 2, 4, 8)
    c.sampling.max_batch = 4  # requests merged into one sampler call
    c.sampling.max_wait_s = 0.05

    c.instrument = ml_collections.ConfigDict()
    c.instrument.mode = "lm"  # lm (frozen copy, verified, static fallback) | static | none
    c.instrument.max_new_tokens = 1024
    c.instrument.temperature = 0.2
    c.instrument.timeout_s = 120.0  # no answer by then: static instrumentation instead

    c.env = ml_collections.ConfigDict()
    c.env.backend = "bwrap"
    c.env.timeout_s = 0.0  # 0: the task's own limit (task.json)
    c.env.memory_mb = 4096
    c.env.cpus = 1.0

    c.reward = ml_collections.ConfigDict()
    c.reward.failure_reward = -10.0
    c.reward.milestone_reward = 0.1
    c.reward.no_training_reward = -10.0
    c.reward.normalisation = "flipped"

    c.learner = ml_collections.ConfigDict()
    c.learner.actor_lr = 3e-5
    c.learner.critic_lr = 1e-4
    c.learner.clip_eps = 0.2
    c.learner.ppo_epochs = 1
    c.learner.num_minibatches = 1
    c.learner.micro_batch_size = 0
    c.learner.agg_mode = "token-mean"
    c.learner.duration_weighting = "batch_mean"
    c.learner.advantage_estimator = "gae"
    c.learner.critic = "separate"
    c.learner.kl_mode = "none"
    c.learner.kl_coef = 0.0
    c.learner.entropy_coef = 0.0
    c.learner.temperature = 0.7  # must equal sampling.temperature
    c.learner.max_grad_norm = 1.0

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1

    c.run = ml_collections.ConfigDict()
    c.run.batch_size = 8
    c.run.slots = 2  # concurrent episodes (one sandbox CPU each)
    c.run.max_steps = 1000
    c.run.time_budget_s = 300.0  # RL wall-clock; the paper fixes time, not steps
    c.run.improve_prob = 0.5
    c.run.max_staleness = 4  # policy versions; older episodes are dropped
    c.run.duration_source = "episode"  # Δt for the weights: episode | execution
    c.run.buffer_size = 16
    c.run.checkpoint_every = 2
    c.run.keep_checkpoints = 2
    c.run.eval_samples = 8  # best-of-N before and after RL
    c.run.progress = True
    return c
