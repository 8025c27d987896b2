"""The run's config sections as dataclasses, and the ConfigDict sections generated from them.

No JAX here: config files import this module. `configs/*.py` build each section with
`config_section(Dataclass, **overrides)`, so every field is reachable as
`--config.SECTION.FIELD=VALUE`; `components.validate_config` builds the dataclasses back with
`from_section` (each checks its own fields in `__post_init__`) and then checks what spans
sections.

  section      dataclass                                  owner
  model        ModelConfig                                here
  prompt       PromptLimits                               here
  sampling     SamplingConfig                             here
  instrument   InstrumentConfig                           here
  env          SandboxConfig (Sandbox's keyword args)     here, defaults = env.sandbox.Sandbox's
  reward       RewardConfig                               env/reward.py
  learner      LearnerConfig                              rl/learner_config.py
  mesh         MeshConfig                                 here
  run          RunConfig                                  here
  warmstart    WarmStartSection                           here
    .settings  WarmStartConfig (less the token limits)    warmstart/config.py
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

from rl4mle_jax.env.instrument_lm import INSTRUMENT_MODES
from rl4mle_jax.env.reward import RewardConfig
from rl4mle_jax.env.sandbox import BACKENDS, parse_preimport
from rl4mle_jax.env.sandbox.common import Limits
from rl4mle_jax.env.trim import TRIM_FIRST
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.rollout.collate import DURATION_FLOOR_S, DURATION_SOURCES
from rl4mle_jax.rollout.task_mix import TASK_SAMPLING


class ConfigError(ValueError):
    """A bad value of one field; `field` names it (validate_config adds the section)."""

    def __init__(self, field: str, msg: str):
        super().__init__(f"{field}: {msg}")
        self.field, self.msg = field, msg


def _need(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ConfigError(field, msg)


# ----------------------------------------------------------------------------- sections
@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hf_dir: str = ""  # a local Hugging Face directory; empty: the warm-started tiny model
    dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class PromptLimits:
    """Token limits of the agent's prompt and response (the warm start follows them)."""

    max_prompt_tokens: int = 512  # fits the prompt of every local task
    max_response_tokens: int = 768
    # What an improve prompt's cut parent keeps first: "imports" or "choices" (its modelling
    # choices; env.prompts.PromptConfig.trim_first, docs/learning_check/results_trim.md).
    trim_first: str = "imports"

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_response_tokens"):
            _need(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _need(self.trim_first in TRIM_FIRST, "trim_first",
              f"must be one of {TRIM_FIRST}, got {self.trim_first!r}")


ENGINES = ("static", "continuous")  # SamplingConfig.engine


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """The policy's sampler and its generation service (rollout.service)."""

    temperature: float = 0.7  # the paper's; learner.temperature must equal it
    # Truncation (rl4mle_jax.sampling.truncate_logits): top-k, top-p nucleus, min-p floor (keep
    # tokens with p >= min_p * p_max). learner.top_k/top_p/min_p must equal these: the learner
    # truncates its logits the same way, so its log-probs are the behaviour distribution's.
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    prompt_buckets: tuple[int, ...] = (256, 512)
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8)
    max_batch: int = 4  # requests merged into one sampler call
    max_wait_s: float = 0.05
    # The static sampler's KV cache grows while a batch decodes, in phases of this many new
    # tokens, then 2x, 4x ... (sampling.cache_phases): a decode step attends over less than
    # twice the slots it has filled, not prompt + the whole max_new bucket; 0: one cache.
    cache_phase_tokens: int = 128
    # "static": merged requests decode as one batch (rollout.service, the reference);
    # "continuous": the slot engine (engine.py), requests join and leave between decode steps.
    engine: str = "static"
    engine_slots: int = 8  # decode slots of each continuous engine (policy, frozen copy)
    # Token steps per jitted engine call, read back together (engine.py): 1 on a CPU; on an
    # accelerator 8-32 (H200: 8 per call 2.2x faster per token at 0.5B, 1.8x at 3B; README).
    engine_steps_per_call: int = 1

    def __post_init__(self):
        _need(self.temperature > 0, "temperature",
              "must be > 0 (PPO needs the behaviour distribution)")
        _need(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        _need(self.top_k >= 0, "top_k", f"must be >= 0 (0: off), got {self.top_k}")
        _need(0 <= self.min_p < 1, "min_p", f"must be in [0, 1) (0: off), got {self.min_p}")
        for name in ("prompt_buckets", "batch_buckets"):
            b = tuple(getattr(self, name))
            _need(len(b) > 0 and all(int(x) == x and x >= 1 for x in b), name,
                  f"must be a non-empty tuple of positive integers, got {b}")
        _need(self.max_batch >= 1, "max_batch", f"must be >= 1, got {self.max_batch}")
        _need(self.cache_phase_tokens >= 0, "cache_phase_tokens",
              f"must be >= 0 (0: one cache), got {self.cache_phase_tokens}")
        _need(self.engine in ENGINES, "engine", f"{self.engine!r} is not one of {ENGINES}")
        _need(self.engine_slots >= 1, "engine_slots", f"must be >= 1, got {self.engine_slots}")
        _need(self.engine_steps_per_call >= 1, "engine_steps_per_call",
              f"must be >= 1, got {self.engine_steps_per_call}")
        _need(self.max_wait_s >= 0, "max_wait_s", f"must be >= 0, got {self.max_wait_s}")


@dataclasses.dataclass(frozen=True)
class InstrumentConfig:
    """Milestone instrumentation (env.instrument_lm.Instrumenter) by the frozen copy."""

    mode: str = "lm"  # see INSTRUMENT_MODES
    max_new_tokens: int = 1024
    temperature: float = 0.2
    timeout_s: float = 120.0  # no answer by then: static instrumentation instead
    # Answers that rewrite a statement or two: markers placed by aligning their statements
    # to the program's (env.instrument_lm); False: only answers that change nothing else.
    realign: bool = False

    def __post_init__(self):
        _need(self.mode in INSTRUMENT_MODES, "mode",
              f"{self.mode!r} is not one of {INSTRUMENT_MODES}")
        _need(self.max_new_tokens >= 1, "max_new_tokens",
              f"must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """The keyword arguments of env.sandbox.Sandbox, with its defaults (a test keeps them so),
    except timeout_s: 0 means the task's own limit (task.json)."""

    backend: str = "bwrap"  # see env.sandbox.BACKENDS
    timeout_s: float = 0.0
    memory_mb: int | None = 8192
    cpus: float = 1.0
    max_procs: int | None = 256
    max_file_mb: int | None = 1024
    output_bytes: int = 256 * 1024
    disk_mb: int | None = 1024
    max_inodes: int | None = 16384
    nice: int = 0  # 0-19 added to each program's niceness (configs/task.py: the learner first)
    ray_inner: str = "bwrap"  # backend "ray": the sandbox each node runs
    ray_address: str | None = None  # backend "ray": cluster to join (None: $RAY_ADDRESS/local)
    # backend "bwrap" as root: modules ("pandas,sklearn.ensemble") imported once by a zygote that
    # forks each program into its run's sandbox (env/sandbox/zygote.py); "": fresh interpreters
    preimport: str = ""

    def __post_init__(self):
        _need(self.backend in BACKENDS, "backend", f"{self.backend!r} is not one of {BACKENDS}")
        _need(self.timeout_s >= 0, "timeout_s", "must be >= 0 (0: the task's own limit)")
        _need(self.ray_inner in BACKENDS and self.ray_inner != "ray", "ray_inner",
              f"{self.ray_inner!r}: give a local backend of {BACKENDS}")
        try:
            parse_preimport(self.preimport)
        except ValueError as e:
            raise ConfigError("preimport", str(e)) from None
        limits = {k: v for k, v in dataclasses.asdict(self).items()
                  if k not in ("backend", "ray_inner", "ray_address", "preimport")}
        try:  # the sandbox's own checks of its limits
            Limits(**{**limits, "timeout_s": 1.0, "cpus": float(self.cpus)})
        except ValueError as e:
            field = str(e).split()[0]
            raise ConfigError(field if hasattr(self, field) else "limits", str(e)) from None

    def sandbox_kwargs(self, task_timeout_s: float) -> dict[str, Any]:
        """Sandbox(**these); timeout_s 0 becomes the task's limit."""
        d = dataclasses.asdict(self)
        d["timeout_s"] = float(self.timeout_s or task_timeout_s)
        return d


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Axis sizes of the learner's device mesh and the devices split off for sampling
    (sharding.make_meshes checks them against the devices)."""

    data: int = -1  # -1: the devices left over
    fsdp: int = 1
    tensor: int = 1
    # The first N devices sample (policy and frozen copy, tensor-parallel) and the rest learn,
    # so sampling never waits for a train step; the learner publishes each new version to
    # them. 0: one mesh, sampling and training take turns on one device lane.
    sampler_devices: int = 0

    def __post_init__(self):
        _need(self.sampler_devices >= 0, "sampler_devices",
              f"must be >= 0 (0: share all devices), got {self.sampler_devices}")


ADMISSION_MODES = ("bounded", "drop_stale")  # RunConfig.admission
# RunConfig.eval_pick, see best_of_n.pick_candidate
PICK_RULES = ("max", "cv", "cv_median", "folds")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The actor-learner loop (train.py)."""

    batch_size: int = 8
    slots: int = 2  # concurrent episodes (one sandbox CPU each)
    max_steps: int = 1000
    time_budget_s: float = 300.0  # RL wall-clock; the paper fixes time, not steps; 0: none
    improve_prob: float = 0.5
    # Admission control ("bounded", AReaL's max_head_offpolicyness): an episode starts only
    # while started-but-not-yet-trained episodes number < (max_staleness + 1) x batch_size, and
    # nothing finished is discarded; "drop_stale": start freely, drop finished episodes more
    # than max_staleness policy versions old (the old loop, for comparisons).
    admission: str = "bounded"
    max_staleness: int = 4  # policy versions
    duration_source: str = "episode"  # Δt for the weights, see rollout.collate.DURATION_SOURCES
    duration_floor_s: float = DURATION_FLOOR_S  # the least Δt
    # Learner batches pad prompt and response to the batch's longest, rounded up to a multiple
    # of this (one compile per shape); 0: to the configured maxima (one shape, more padding).
    length_bucket: int = 64
    # Compile the train step ahead, on its own thread while episodes run, for every (P, R) a
    # batch will have with at least this probability (rollout.collate.ShapeForecast, from the
    # recent episodes' lengths): the first step at a shape then waits for no compile.
    precompile: bool = True
    precompile_min_prob: float = 0.1
    # ... and only where that pays (rollout.collate.compile_pays_off): the steps expected at the
    # shape times what each saves against running padded to a compiled shape must be at least
    # this many times the compile's share of the machine (on the CPU backend it takes a core
    # from the loop; on an accelerator it costs the loop nothing). 0: every likely shape (the
    # setting before 2026-12-07; measured in docs/learning_check/results_payback.md).
    precompile_payback: float = 1.0
    # A batch whose own (P, R) is not compiled yet runs padded to the smallest compiled shape
    # that holds it (rollout.collate.smallest_cover) instead of compiling inside the step; the
    # compile-ahead thread compiles a likely shape only when that padding would add more than
    # this fraction of its tokens (a rare long batch pads: one compile costs ~2-10 steps' padding).
    pad_slack: float = 0.15
    # Before the RL clock starts, compile what its first minutes would otherwise compile inside
    # it: each generation service's programs (every merged batch size, every prompt bucket) and
    # the train step at up to `warmup_shapes` batch shapes: the largest (every batch fits it,
    # padded, so no step compiles inside the clock) and the likeliest, forecast as above from
    # the initial best-of-N's lengths (same policy, same prompt kinds). Its time is reported.
    warmup: bool = True
    warmup_shapes: int = 2
    # And execute the train step once at each warm-up shape, on a copy of the state, on the CPU
    # backend with one process: XLA:CPU's first execution of a shape faults in its temporaries'
    # pages (~20 s at the largest shape here, Learner.run_once); later steps reuse them.
    warmup_execute: bool = True
    # A program byte-identical to an earlier episode's reuses that run's record and Δt (waiting
    # out its time, so arrival order holds) up to this many times, then runs afresh
    # (rollout/run_cache.py). 0: every program runs (the paper).
    reuse_runs: int = 0
    # Score ranking among the valid episodes of each learner batch: a valid row's reward in
    # the batch gets rank_bonus x (its centred rank among the batch's valid rows, in
    # [-1/2, 1/2]; ties share a rank; per task in multi-task runs) added. A failure's reward
    # and the mean reward of the valid rows are unchanged, so the failure-vs-valid signal is
    # the paper's; the ranking lets a better program beat a worse one whatever the score's
    # scale (raw AUC differences of 0.01 weigh ~1/1000 of a failure's -10). The experience log
    # and every reward metric keep the paper's reward (rl.advantages.valid_rank_bonus). 0: off.
    # configs/task.py sets 1.0 with its entropy minimisation, which otherwise sharpens onto
    # whichever valid program is most frequent (alone, 1.0 changed nothing measurable on seeds
    # 5-7: docs/sweep_rloo; with it: docs/sweep_entropy).
    rank_bonus: float = 0.0
    # With rank_bonus: two valid rows whose score difference is within rank_tie_se x its
    # standard error on the split (a paired bootstrap over the grader's shared resamples,
    # env.grading.GradeReport.score_boot) tie instead of one beating the other, so the bonus
    # does not rank gaps the reward split cannot resolve. 0: every difference ranks. Measured
    # at 1 with the default (docs/sweep_ties): the policy concentrated on one program as
    # before, the picks did not improve, food-reviews gained less reward; not adopted.
    rank_tie_se: float = 0.0
    buffer_size: int = 16
    checkpoint_every: int = 2
    keep_checkpoints: int = 2
    # Best-of-N before and after RL, on the same draws. 32: a valid-rate change of 0.25 is ~2.3
    # standard errors of one run's difference (p ≈ 0.7) and ~4 of a 3-seed mean; 8 is ±0.25 noise.
    eval_samples: int = 32
    # How the best-of-N picks (PICK_RULES): "max", the best reward-split score; "cv", the finalists
    # (below: distinct programs near the best reward-split score) run again on `eval_select_folds`
    # selection splits, carves of public train the loop never trains on, and the best mean over
    # those and the reward split wins; "folds", the selection splits alone; "cv_median", the median
    # over the reward split and those (one split's lucky carve cannot carry a finalist). The pick
    # does not change the candidates: an evaluation cached under one rule is re-picked under another
    # (best_of_n.select_pick). "cv" by measurement (docs/pick_replay): re-picking 104 evaluations of
    # 60 runs, it chose another program than the maximum in 39 and that one was better on the test
    # split in 36.
    eval_pick: str = "cv"
    eval_select_folds: int = 2
    # The finalists (best_of_n.finalists): distinct programs valid on the reward split within
    # `eval_finalist_se` paired standard errors of the best there, at most `eval_finalists`,
    # one per reward-split outcome. 3 / 10 by measurement (docs/pick_replay/finalists.md): on
    # 39 evaluations of 30 runs the wider set's cv pick beat the reward-split maximum on test
    # in 28 and lost in 1 (2 / 6, the setting before: 21 and 4); more folds did not help. On 15
    # synthetic-tradeoff evaluations it changed one pick, for the worse (there cv itself loses
    # to the maximum); one place per outcome changed none of those 15.
    eval_finalist_se: float = 3.0
    eval_finalists: int = 10
    progress: bool = True
    # Multi-task training (config.tasks): how each episode's task is drawn, see
    # rollout/task_mix.py ("uniform", or "separation": ∝ each task's recent reward separation,
    # with `task_sampling_floor` of the draws uniform so no task starves).
    task_sampling: str = "uniform"
    task_sampling_floor: float = 0.25
    task_separation_window: int = 32  # a task's last trained episodes its separation reads
    task_separation_group: int = 4  # consecutive episodes of one task per separation group

    def __post_init__(self):
        for name in ("slots", "batch_size", "max_steps"):
            _need(getattr(self, name) >= 1, name, "must be >= 1")
        _need(self.duration_source in DURATION_SOURCES, "duration_source",
              f"{self.duration_source!r} is not one of {DURATION_SOURCES}")
        _need(self.duration_floor_s >= 0, "duration_floor_s",
              f"must be >= 0, got {self.duration_floor_s}")
        _need(0.0 <= self.improve_prob <= 1.0, "improve_prob", "must be in [0, 1]")
        _need(self.length_bucket >= 0, "length_bucket", f"must be >= 0, got {self.length_bucket}")
        _need(self.warmup_shapes >= 0, "warmup_shapes", f"must be >= 0, got {self.warmup_shapes}")
        _need(self.pad_slack >= 0, "pad_slack", f"must be >= 0, got {self.pad_slack}")
        _need(self.precompile_payback >= 0, "precompile_payback",
              f"must be >= 0, got {self.precompile_payback}")
        _need(0.0 < self.precompile_min_prob <= 1.0, "precompile_min_prob",
              f"must be in (0, 1], got {self.precompile_min_prob}")
        _need(self.admission in ADMISSION_MODES, "admission",
              f"{self.admission!r} is not one of {ADMISSION_MODES}")
        _need(self.max_staleness >= 0, "max_staleness", f"must be >= 0, got {self.max_staleness}")
        _need(self.reuse_runs >= 0, "reuse_runs", f"must be >= 0, got {self.reuse_runs}")
        _need(self.eval_pick in PICK_RULES, "eval_pick",
              f"{self.eval_pick!r} is not one of {PICK_RULES}")
        _need(self.eval_select_folds >= (1 if self.eval_pick != "max" else 0),
              "eval_select_folds", f"must be >= 1 with eval_pick={self.eval_pick!r} "
              f"(>= 0 otherwise), got {self.eval_select_folds}")
        _need(self.eval_finalist_se >= 0, "eval_finalist_se",
              f"must be >= 0, got {self.eval_finalist_se}")
        _need(self.eval_finalists >= 1, "eval_finalists",
              f"must be >= 1, got {self.eval_finalists}")
        _need(self.rank_bonus >= 0, "rank_bonus", f"must be >= 0, got {self.rank_bonus}")
        _need(self.rank_tie_se >= 0, "rank_tie_se", f"must be >= 0, got {self.rank_tie_se}")
        _need(self.task_sampling in TASK_SAMPLING, "task_sampling",
              f"{self.task_sampling!r} is not one of {TASK_SAMPLING}")
        _need(0.0 <= self.task_sampling_floor <= 1.0, "task_sampling_floor",
              f"must be in [0, 1], got {self.task_sampling_floor}")
        _need(self.task_separation_group >= 2, "task_separation_group",
              f"must be >= 2 (a group of one never separates), got {self.task_separation_group}")
        _need(self.task_separation_window >= self.task_separation_group,
              "task_separation_window", f"{self.task_separation_window} must be >= "
              f"task_separation_group={self.task_separation_group} (at least one whole group)")


@dataclasses.dataclass(frozen=True)
class RescueConfig:
    """SFT rescue (rl/rescue.py): supervised steps on a reference when RL has no signal."""

    enabled: bool = False
    window_steps: int = 4  # learner batches each rule looks at (and between two rescues)
    margin: float = 0.05  # reward a reference must beat every recent batch's best by
    # SFT steps of a rescue: at least sft_min_steps, then until the reference's mean token
    # loss is <= sft_target_loss, at most sft_steps (which wins over sft_min_steps). A fixed
    # 24 steps (loss 1.4 -> 0.4) left a weak warm start (40 of 240 SFT steps) writing 0/16
    # valid programs; the warm start itself ends at loss 0.04.
    sft_steps: int = 200
    sft_min_steps: int = 8
    sft_target_loss: float = 0.05
    sft_lr: float = 1e-3
    patience_steps: int = 8  # batches after a rescue to show reward separation, else stop
    max_rescues: int = 2
    reference_file: str = ""  # a user's own solution.py (graded once on the reward split)

    def __post_init__(self):
        for name in ("window_steps", "sft_steps", "sft_min_steps", "patience_steps"):
            _need(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        _need(self.sft_target_loss >= 0, "sft_target_loss",
              f"must be >= 0, got {self.sft_target_loss}")
        _need(self.max_rescues >= 0, "max_rescues", f"must be >= 0, got {self.max_rescues}")
        _need(self.sft_lr > 0, "sft_lr", f"must be > 0, got {self.sft_lr}")
        _need(self.margin >= 0, "margin", f"must be >= 0, got {self.margin}")


@dataclasses.dataclass(frozen=True)
class WarmStartSection:
    """The warm start's switch and cache; its settings are warmstart.WarmStartConfig."""

    enabled: bool = True
    cache_dir: str = ""  # default: $RL4MLE_WARMSTART or ~/.cache/rl4mle_jax/warmstart


# Sections built and checked the same way (warmstart has a nested `settings` of its own).
SECTIONS: dict[str, type] = {
    "model": ModelConfig, "prompt": PromptLimits, "sampling": SamplingConfig,
    "instrument": InstrumentConfig, "env": SandboxConfig, "reward": RewardConfig,
    "learner": LearnerConfig, "mesh": MeshConfig, "run": RunConfig, "rescue": RescueConfig,
}
# Warm-start settings that follow c.prompt instead of being set twice.
WARMSTART_FROM_PROMPT = ("max_prompt_tokens", "max_response_tokens")


# ----------------------------------------------------------------------------- ConfigDict
def _placeholder_type(hint: Any) -> type:
    """float for `float | None` (the type a None default can be set to on the command line)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and isinstance(args[0], type):
            return args[0]
    return object


def config_section(cls: type, exclude: tuple[str, ...] = (), **overrides: Any
                   ) -> ml_collections.ConfigDict:
    """Every field of dataclass `cls` (its default, or the override) as a ConfigDict.

    A None default becomes a typed placeholder, so `--config.x.field=VALUE` can set it.
    """
    defaults = dataclasses.asdict(cls())
    names = [f.name for f in dataclasses.fields(cls) if f.name not in exclude]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise KeyError(f"{cls.__name__} has no fields {unknown}; known: {names}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name in names:
        v = overrides.get(name, defaults[name])
        values[name] = config_dict.placeholder(_placeholder_type(hints[name])) if v is None else v
    return ml_collections.ConfigDict(values)


def from_section(cls: type, section: Mapping[str, Any]) -> Any:
    """The dataclass back from its ConfigDict section (lists from JSON become tuples)."""
    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    if hasattr(cls, "from_dict"):
        return cls.from_dict(d)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise KeyError(f"unknown keys {unknown}; known: {sorted(known)}")
    return cls(**d)
