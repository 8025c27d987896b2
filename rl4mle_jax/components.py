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

from rl4mle_jax import models, run_config, sharding
from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.reward import RewardConfig
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.validate import validate_task
from rl4mle_jax.models.tokenizer import load_tokenizer
from rl4mle_jax.rollout.episode import EpisodeConfig
from rl4mle_jax.sampling import Sampler
from rl4mle_jax.warmstart.config import WarmStartConfig

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


def validate_config(config: Any) -> dict[str, Any]:
    """Fails before any work starts, naming the key, on values the run cannot use.

    Each section is built into the dataclass that owns it (run_config.SECTIONS), which checks
    its own fields; what spans sections is checked here. Returns the built sections.
    """
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ValueError(f"config.{key}: {msg}")

    need(bool(config.task), "task", "give a local task id or a task directory")
    built: dict[str, Any] = {}
    for name, cls in run_config.SECTIONS.items():
        try:
            built[name] = run_config.from_section(cls, config[name])
        except run_config.ConfigError as e:
            raise ValueError(f"config.{name}.{e.field}: {e.msg}") from e
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"config.{name}: {e}") from e
    ws = run_config.from_section(run_config.WarmStartSection,
                                 {k: v for k, v in config.warmstart.items() if k != "settings"})
    try:
        WarmStartConfig.from_mapping({**config.warmstart.settings.to_dict(),
                                      **{k: config.prompt[k]
                                         for k in run_config.WARMSTART_FROM_PROMPT}})
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.warmstart.settings: {e}") from e
    samp, prompt, learner, run = (built[k] for k in ("sampling", "prompt", "learner", "run"))

    need(abs(learner.temperature - samp.temperature) < 1e-9, "learner.temperature",
         f"{learner.temperature} must equal sampling.temperature={samp.temperature} "
         "(the learner recomputes log-probs at the sampling temperature)")
    need(max(samp.prompt_buckets) >= prompt.max_prompt_tokens,
         "sampling.prompt_buckets", f"largest bucket {max(samp.prompt_buckets)} is "
         f"below prompt.max_prompt_tokens={prompt.max_prompt_tokens}")
    need(built["model"].hf_dir or ws.enabled, "model.hf_dir",
         "give a Hugging Face directory or enable the warm start")
    try:
        meshes = sharding.make_meshes(**dataclasses.asdict(built["mesh"]))
    except ValueError as e:
        raise ValueError(f"config.mesh: {e}") from e
    # Only the learner's mesh shards the batch (the sampler's devices are not in it).
    divisor = sharding.batch_divisor(meshes.learner)
    need(run.batch_size % divisor == 0, "run.batch_size",
         f"{run.batch_size} is not a multiple of the learner mesh's data × fsdp size {divisor} "
         f"({meshes.learner.devices.size} devices"
         + (f", after mesh.sampler_devices={built['mesh'].sampler_devices}"
            if meshes.sampler is not None else "") + "); change run.batch_size or config.mesh")
    # The learner splits each batch into num_minibatches updates of micro-batches.
    need(run.batch_size % learner.num_minibatches == 0, "run.batch_size",
         f"{run.batch_size} is not a multiple of learner.num_minibatches="
         f"{learner.num_minibatches}")
    minibatch = run.batch_size // learner.num_minibatches
    need(not learner.micro_batch_size or minibatch % learner.micro_batch_size == 0,
         "run.batch_size", f"{run.batch_size} / learner.num_minibatches="
         f"{learner.num_minibatches} gives minibatches of {minibatch} rows, not a multiple of "
         f"learner.micro_batch_size={learner.micro_batch_size}")
    need(learner.advantage_estimator == "gae" or not learner.group_size
         or run.batch_size % learner.group_size == 0,
         "run.batch_size", f"{run.batch_size} is not a multiple of learner.group_size="
         f"{learner.group_size} ({learner.advantage_estimator} groups consecutive rows)")
    return built


def _prompt_config(config: Any, chat: bool) -> prompts_lib.PromptConfig:
    return prompts_lib.PromptConfig(
        max_prompt_tokens=config.prompt.max_prompt_tokens,
        max_response_tokens=config.prompt.max_response_tokens,
        system_prompt=prompts_lib.QWEN_DEFAULT_SYSTEM if chat else None)


def _warn_if_description_cut(context: Any, prompt_cfg: Any, tokenizer: Any) -> None:
    """The solve prompt with the policy's own tokenizer: say what of the description is cut."""
    count = lambda s: len(tokenizer.encode(s))  # noqa: E731
    chat = tokenizer.apply_chat_template if tokenizer.is_chat else None
    prompt = prompts_lib.solve_prompt(context, cfg=prompt_cfg, chat_template=chat,
                                      count_tokens=count)
    cut = prompts_lib.description_cut(context, prompt, count)
    if cut:
        total, kept, dropped = cut
        lines = [line for line in dropped.splitlines() if line.strip()]
        log.warning("task: the description (%d tokens) is cut to %d to fit "
                    "prompt.max_prompt_tokens=%d: %d lines dropped, from %r", total, kept,
                    prompt_cfg.max_prompt_tokens, len(lines), lines[0][:80] if lines else "")


def build_components(config: Any, workdir: Path) -> Components:
    """Everything a run needs, from a validated config (the warm start is built if missing)."""
    sections = validate_config(config)
    data_root = config.data_root or None
    # Before any work: every problem of the task named at once (env.validate).
    check = validate_task(str(config.task), data_root=data_root,
                          max_prompt_tokens=config.prompt.max_prompt_tokens,
                          warmstart=not config.model.hf_dir)
    for w in check.warnings:
        log.warning("task: %s", w)
    check.raise_for_errors()
    task = check.task  # a directory, a suite id or an MLE-bench id, loaded once
    sandbox = Sandbox(**sections["env"].sandbox_kwargs(task.timeout_s))
    timeout_s = sandbox.limits.timeout_s
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
            [task], cache, {**dict(config.warmstart.settings),
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
    _warn_if_description_cut(context, prompt_cfg, tokenizer)
    samp = config.sampling
    sampler = Sampler(model_config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=tuple(samp.prompt_buckets),
                      batch_buckets=tuple(samp.batch_buckets),
                      max_new_tokens=config.prompt.max_response_tokens)
    return Components(
        task=task, tokenizer=tokenizer, model_config=model_config, params=params,
        sampler=sampler, sandbox=sandbox, context=context, prompt_cfg=prompt_cfg,
        reward_cfg=sections["reward"],
        episode_cfg=EpisodeConfig(improve_prob=config.run.improve_prob, split="reward",
                                  timeout_s=timeout_s,
                                  instrument_timeout_s=config.instrument.timeout_s,
                                  reuse_runs=config.run.reuse_runs),
        source=source)
