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
from rl4mle_jax.env.baselines import ensure_reference_scores, ensure_reference_se
from rl4mle_jax.env.reward import (
    RewardConfig,
    normalise_score,
    rescale_unit,
    rescales,
    valid_floor,
)
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import default_data_root
from rl4mle_jax.env.validate import validate_task
from rl4mle_jax.models.tokenizer import load_tokenizer
from rl4mle_jax.rollout.episode import EpisodeConfig
from rl4mle_jax.sampling import Sampler, truncation_settings
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
    # Multi-task training (config.tasks): one view per task, in config order; each is this
    # object with that task's task, sandbox (its time limit), prompt context and episode
    # config, so every per-task step (episodes, best-of-N, references, report) takes a view.
    # Empty for one task.
    views: dict = dataclasses.field(default_factory=dict)

    def close(self) -> None:
        """Closes the sandboxes (their threads and pre-imported interpreters)."""
        for box in {id(b): b for b in (self.sandbox, *(v.sandbox for v in self.views.values()))
                    }.values():
            box.close()


def task_views(comps: Components) -> dict[str, Components]:
    """task id -> the run's components for that task (one entry for a single-task run)."""
    return comps.views or {comps.task.id: comps}


def task_names(config: Any) -> list[str]:
    """The run's task ids or directories: config.tasks split on commas when set (multi-task
    training), else [config.task]."""
    tasks = str(config.get("tasks", "") or "")
    return [t.strip() for t in tasks.split(",")] if tasks.strip() else [str(config.task)]


def validate_config(config: Any) -> dict[str, Any]:
    """Fails before any work starts, naming the key, on values the run cannot use.

    Each section is built into the dataclass that owns it (run_config.SECTIONS), which checks
    its own fields; what spans sections is checked here. Returns the built sections.
    """
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ValueError(f"config.{key}: {msg}")

    names = task_names(config)
    need(bool(config.task) or len(names) > 1, "task", "give a local task id or a task directory")
    need(all(names), "tasks", f"{config.get('tasks')!r} has an empty entry; give ids or "
         "directories separated by commas")
    need(len(set(names)) == len(names), "tasks", f"{config.get('tasks')!r} names a task twice")
    need(len(names) == 1 or not config.rescue.reference_file, "rescue.reference_file",
         "is one task's solution; multi-task rescues use each task's demonstrations and best "
         "solution (leave it empty with config.tasks)")
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
    want = truncation_settings(samp)
    for name, have in truncation_settings(learner).items():
        need(have == want[name], f"learner.{name}",
             f"{have} must equal sampling.{name}={want[name]} (the learner truncates its "
             "logits as the sampler did, so that its log-probs are of the distribution the "
             "tokens were drawn from)")
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
        trim_first=config.prompt.trim_first,
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


def build_warmstart_for(config: Any, tasks: list[Any], sandbox: Any, libraries: list[str]):
    """The warm start a run of `config` starts from (built, or loaded from its cache)."""
    from rl4mle_jax import warmstart

    # The warm start renders its demonstrations with the very prompts the loop will use.
    cache = (Path(config.warmstart.cache_dir).expanduser() if config.warmstart.cache_dir
             else warmstart.default_warmstart_dir())
    return warmstart.build_warmstart(
        tasks, cache, {**dict(config.warmstart.settings),
                       "max_prompt_tokens": config.prompt.max_prompt_tokens,
                       "max_response_tokens": config.prompt.max_response_tokens},
        prompt_config=_prompt_config(config, chat=False), libraries=libraries,
        sandbox=sandbox, data_root=config.data_root or None, log=log.info)


def build_components(config: Any, workdir: Path) -> Components:
    """Everything a run needs, from a validated config (the warm start is built if missing)."""
    sections = validate_config(config)
    data_root = config.data_root or None
    names = task_names(config)
    tasks = []
    for name in names:  # before any work: every problem of each task named at once
        check = validate_task(name, data_root=data_root,
                              max_prompt_tokens=config.prompt.max_prompt_tokens,
                              warmstart=not config.model.hf_dir)
        for w in check.warnings:
            log.warning("task%s: %s", f" {name}" if len(names) > 1 else "", w)
        check.raise_for_errors()
        tasks.append(check.task)  # a directory, a suite id or an MLE-bench id, loaded once
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"config.tasks: {names} load as task ids {ids}; each task needs its "
                         "own id (task.json)")
    sandboxes = [Sandbox(**sections["env"].sandbox_kwargs(t.timeout_s)) for t in tasks]
    sandbox = sandboxes[0]
    # A task directory without reference scores gets its generated baseline and strong
    # solutions' where the reward's scale needs them ("auto", "rescaled"; the report places the
    # pick against them too). The paper's "flipped" runs without, as before.
    ref_cache = Path(data_root).expanduser() if data_root else default_data_root()
    needs_refs = sections["reward"].normalisation in ("auto", "rescaled")
    for t, box in zip(tasks, sandboxes):
        if needs_refs and not ensure_reference_scores(
                t, box, ref_cache / "_references", log.info, sections["reward"].baseline_key):
            log.warning("task %s: no reward-split baseline score (task.json reference_scores), "
                        "and its generated baseline solution did not score either: "
                        "reward.normalisation=%r pays a valid score as the paper's flipped "
                        "score (under 'auto', at least a failure's with every milestone); "
                        "record references with `python -m rl4mle_jax.env calibrate DIR "
                        "--write`", t.id, sections["reward"].normalisation)
        if needs_refs and rescales((t.reference_scores or {}).get("reward") or {},
                                   sections["reward"]):
            if sections["reward"].rescale_min_se:
                ensure_reference_se(t, box, ref_cache / "_references", log.info)
            _log_rescale_unit(t, sections["reward"])
    if len(tasks) > 1:
        _check_multitask_reward(tasks, sections["reward"])
    for t in tasks:
        _check_valid_beats_failure(t, sections["reward"])
    task = tasks[0]
    timeout_s = sandbox.limits.timeout_s
    # What the prompt lists as installed is probed inside the sandbox the programs run in.
    libraries = sorted(prompts_lib.probe_libraries(sandbox, input_dir=task.input_dir("reward")))
    dtype = jnp.dtype(config.model.dtype)
    if config.model.hf_dir:
        hf_dir = Path(config.model.hf_dir).expanduser()
        tokenizer = load_tokenizer(hf_dir)
        source: dict[str, Any] = {"hf_dir": str(hf_dir)}
    else:
        ws = build_warmstart_for(config, tasks, sandbox, libraries)
        hf_dir, tokenizer = ws.hf_dir, load_tokenizer(ws.hf_dir)
        source = {"warmstart": str(ws.hf_dir), "cached": ws.cached, **ws.stats}
    model_config, params = models.load_hf_checkpoint(hf_dir, dtype=dtype)
    prompt_cfg = _prompt_config(config, tokenizer.is_chat)
    contexts = []
    for t, box in zip(tasks, sandboxes):
        ctx = dataclasses.replace(prompts_lib.task_context(t, libraries, "reward", prompt_cfg),
                                  timeout_s=box.limits.timeout_s)  # the prompt states the limit
        _warn_if_description_cut(ctx, prompt_cfg, tokenizer)
        contexts.append(ctx)
    context = contexts[0]
    samp = config.sampling
    sampler = Sampler(model_config, tokenizer.stop_token_ids, tokenizer.pad_id,
                      prompt_buckets=tuple(samp.prompt_buckets),
                      batch_buckets=tuple(samp.batch_buckets),
                      max_new_tokens=config.prompt.max_response_tokens,
                      cache_phase_tokens=samp.cache_phase_tokens)

    def episode_cfg(limit_s: float) -> EpisodeConfig:
        return EpisodeConfig(improve_prob=config.run.improve_prob, split="reward",
                             timeout_s=limit_s, instrument_timeout_s=config.instrument.timeout_s,
                             reuse_runs=config.run.reuse_runs)

    comps = Components(
        task=task, tokenizer=tokenizer, model_config=model_config, params=params,
        sampler=sampler, sandbox=sandbox, context=context, prompt_cfg=prompt_cfg,
        reward_cfg=sections["reward"], episode_cfg=episode_cfg(timeout_s), source=source)
    if len(tasks) > 1:
        comps.views = {t.id: dataclasses.replace(comps, task=t, sandbox=box, context=ctx,
                                                 episode_cfg=episode_cfg(box.limits.timeout_s))
                       for t, box, ctx in zip(tasks, sandboxes, contexts)}
    return comps


def _log_rescale_unit(task: Any, reward: RewardConfig) -> None:
    refs = task.reference_scores["reward"]
    se = (task.reference_se or {}).get("reward")
    unit, gap = rescale_unit(refs, reward, se), rescale_unit(refs, reward)
    floor = ""
    if se is not None and reward.rescale_min_se:
        floor = f"; at least {reward.rescale_min_se:g} x the split's standard error {se:.4g}"
        if unit > gap:
            floor += ", which is larger: the gap is below what the split resolves"
    log.info("task %s: one unit of the rescaled reward is a %s difference of %.4g (the "
             "references' gap %.4g%s)", task.id, task.metric, unit, gap, floor)


def _check_valid_beats_failure(task: Any, reward: RewardConfig) -> None:
    """Warn where the task's own baseline, a valid submission, would be rewarded no better than
    a failure with every milestone (e.g. an RMSE of 22.8 flipped to -22.8 against -9.4): the
    policy would learn to fail. "auto" and "rescaled" put such a task on its references."""
    refs = (task.reference_scores or {}).get("reward") or {}
    base = refs.get(reward.baseline_key)
    if base is None:
        return
    value, used = normalise_score(float(base), task.direction, refs, reward,
                                  (task.reference_se or {}).get("reward"))
    best_failure = valid_floor(reward)  # a failure that reached every milestone
    if value <= best_failure:
        log.warning("task %s: its baseline (%s %.4g on the reward split) gets reward %.3g under "
                    "config.reward.normalisation=%r (%s), no more than a failure's %.3g: the "
                    "policy would learn to fail; use 'auto' or 'rescaled'", task.id, task.metric,
                    base, value, reward.normalisation, used, best_failure)


def _check_multitask_reward(tasks: list[Any], reward: RewardConfig) -> None:
    """One policy's rewards on several tasks must share a scale: "rescaled" puts each task's
    score against its own reward-split references, so each task needs them."""
    if reward.normalisation != "rescaled":
        metrics = sorted({f"{t.metric} ({t.direction})" for t in tasks})
        log.warning("config.reward.normalisation=%r with several tasks: each task's rewards "
                    "are its metric's own scale (%s); 'rescaled' puts every task against its "
                    "baseline and strong references", reward.normalisation, ", ".join(metrics))
        return
    missing = [t.id for t in tasks
               if (t.reference_scores or {}).get("reward", {}).get(reward.baseline_key) is None]
    if missing:
        raise ValueError(f"config.reward.normalisation='rescaled': tasks {missing} have no "
                         f"reward-split {reward.baseline_key!r} reference score (task.json "
                         "reference_scores), so their rewards could not be rescaled")
