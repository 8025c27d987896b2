"""Config → the live objects of a run: task, tokenizer, model, sampler, sandbox, prompt context.

The policy comes from a local Hugging Face directory (`model.hf_dir`, e.g. Qwen2.5-3B-Instruct)
or, when none is given, from the cached warm start of the tiny model; both go through the same
`load_hf_checkpoint` / `load_tokenizer` path.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from rl4mle_jax import models, sharding
from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.reward import RewardConfig
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import load_task, prepare_task
from rl4mle_jax.models.tokenizer import load_tokenizer
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.rollout.episode import EpisodeConfig
from rl4mle_jax.sampling import Sampler

log = logging.getLogger("rl4mle_jax.components")


@dataclasses.dataclass
class Components:
    task: Any
    tokenizer: Any
    model_config: models.Qwen2Config
    params: Any  # initial policy params (host or device), also the frozen copy
    sampler: Sampler
    sandbox: Sandbox
    context: prompts_lib.TaskContext
    prompt_cfg: prompts_lib.PromptConfig
    reward_cfg: RewardConfig
    episode_cfg: EpisodeConfig
    source: dict  # where the policy came from (hf_dir or warm start stats)


def validate_config(config: Any) -> None:
    """Fails before any work starts, naming the key, on values the run cannot use."""
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ValueError(f"config.{key}: {msg}")

    need(bool(config.task), "task", "give a local task id or a task directory")
    need(config.env.backend in ("bwrap", "subprocess", "docker"), "env.backend",
         f"{config.env.backend!r} is not bwrap|subprocess|docker")
    need(config.env.timeout_s >= 0, "env.timeout_s", "must be >= 0 (0: the task's own limit)")
    need(config.run.slots >= 1, "run.slots", "must be >= 1")
    need(config.run.batch_size >= 1, "run.batch_size", "must be >= 1")
    need(config.run.max_steps >= 1, "run.max_steps", "must be >= 1")
    need(config.run.duration_source in ("episode", "execution"), "run.duration_source",
         f"{config.run.duration_source!r} is not episode|execution")
    need(0.0 <= config.run.improve_prob <= 1.0, "run.improve_prob", "must be in [0, 1]")
    need(config.instrument.mode in ("lm", "static", "none"), "instrument.mode",
         f"{config.instrument.mode!r} is not lm|static|none")
    need(config.sampling.temperature > 0, "sampling.temperature",
         "must be > 0 (PPO needs the behaviour distribution)")
    need(config.sampling.top_p == 1.0 and config.sampling.top_k == 0, "sampling.top_p/top_k",
         "truncated sampling makes behaviour log-probs differ from the learner's; keep 1.0/0")
    need(max(config.sampling.prompt_buckets) >= config.prompt.max_prompt_tokens,
         "sampling.prompt_buckets", f"largest bucket {max(config.sampling.prompt_buckets)} is "
         f"below prompt.max_prompt_tokens={config.prompt.max_prompt_tokens}")
    need(config.model.hf_dir or config.warmstart.enabled, "model.hf_dir",
         "give a Hugging Face directory or enable the warm start")
    try:
        mesh = sharding.make_mesh(**dict(config.mesh))
    except ValueError as e:
        raise ValueError(f"config.mesh: {e}") from e
    divisor = sharding.batch_divisor(mesh)
    need(config.run.batch_size % divisor == 0, "run.batch_size",
         f"{config.run.batch_size} is not a multiple of the mesh's data × fsdp size {divisor} "
         f"({len(mesh.devices.flat)} devices); change run.batch_size or config.mesh")
    for section, cls in (("learner", LearnerConfig), ("reward", RewardConfig)):
        try:
            (cls.from_dict(dict(config[section])) if hasattr(cls, "from_dict")
             else cls(**dict(config[section])))
        except (TypeError, ValueError) as e:
            raise ValueError(f"config.{section}: {e}") from e
    learner_temp = config.learner.get("temperature", 1.0)
    need(abs(learner_temp - config.sampling.temperature) < 1e-9, "learner.temperature",
         f"{learner_temp} must equal sampling.temperature={config.sampling.temperature} "
         "(the learner recomputes log-probs at the sampling temperature)")


def _prompt_config(config: Any, chat: bool) -> prompts_lib.PromptConfig:
    return prompts_lib.PromptConfig(
        max_prompt_tokens=config.prompt.max_prompt_tokens,
        max_response_tokens=config.prompt.max_response_tokens,
        system_prompt=prompts_lib.QWEN_DEFAULT_SYSTEM if chat else None)


def build_components(config: Any, workdir: Path) -> Components:
    """Everything a run needs, from a validated config (the warm start is built if missing)."""
    validate_config(config)
    data_root = config.data_root or None
    task_path = Path(str(config.task)).expanduser()
    task = (load_task(task_path, data_root) if task_path.exists()
            else prepare_task(str(config.task), data_root))
    env = config.env
    timeout_s = float(env.timeout_s or task.timeout_s)
    sandbox = Sandbox(backend=env.backend, timeout_s=timeout_s, memory_mb=env.memory_mb,
                      cpus=env.cpus)
    # What the prompt lists as installed is probed inside the sandbox the programs run in.
    libraries = sorted(prompts_lib.probe_libraries(sandbox, input_dir=task.input_dir("reward")))
    dtype = jnp.dtype(config.model.dtype)
    if config.model.hf_dir:
        hf_dir = Path(config.model.hf_dir).expanduser()
        tokenizer = load_tokenizer(hf_dir)
        source: dict[str, Any] = {"hf_dir": str(hf_dir)}
    else:
        from rl4mle_jax import warmstart

        # The warm start renders its demonstrations with the very prompts the loop will use.
        cache = (Path(config.warmstart.cache_dir).expanduser() if config.warmstart.cache_dir
                 else warmstart.default_warmstart_dir())
        ws = warmstart.build_warmstart(
            [task.id], cache, {**dict(config.warmstart.settings),
                               "max_prompt_tokens": config.prompt.max_prompt_tokens,
                               "max_response_tokens": config.prompt.max_response_tokens},
            prompt_config=_prompt_config(config, chat=False), libraries=libraries,
            sandbox=sandbox, data_root=data_root, log=log.info)
        hf_dir, tokenizer = ws.hf_dir, load_tokenizer(ws.hf_dir)
        source = {"warmstart": str(ws.hf_dir), "cached": ws.cached, **ws.stats}
    model_config, params = models.load_hf_checkpoint(hf_dir, dtype=dtype)
    prompt_cfg = _prompt_config(config, tokenizer.is_chat)
    context = dataclasses.replace(prompts_lib.task_context(task, libraries, "reward", prompt_cfg),
                                  timeout_s=timeout_s)  # the prompt states the real limit
    samp = config.sampling
    sampler = Sampler(model_config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=tuple(samp.prompt_buckets),
                      batch_buckets=tuple(samp.batch_buckets),
                      max_new_tokens=config.prompt.max_response_tokens)
    return Components(
        task=task, tokenizer=tokenizer, model_config=model_config, params=params,
        sampler=sampler, sandbox=sandbox, context=context, prompt_cfg=prompt_cfg,
        reward_cfg=RewardConfig(**dict(config.reward)),
        episode_cfg=EpisodeConfig(improve_prob=config.run.improve_prob, split="reward",
                                  timeout_s=timeout_s,
                                  instrument_timeout_s=config.instrument.timeout_s),
        source=source)
