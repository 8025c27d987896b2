"""The warm start's settings and default cache directory (no JAX: config files import this)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def default_warmstart_dir() -> Path:
    """$RL4MLE_WARMSTART, else ~/.cache/rl4mle_jax/warmstart."""
    env = os.environ.get("RL4MLE_WARMSTART")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rl4mle_jax" / "warmstart"


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Everything that changes the warm-started model (all of it is in the cache key)."""

    preset: str = "tiny"
    model_overrides: tuple[tuple[str, Any], ...] = ()  # e.g. (("num_hidden_layers", 2),)
    vocab_size: int = 4096
    in_domain_repeats: int = 4  # weight of demos/prompts against the code corpus in the BPE
    code_corpus_bytes: int = 1_000_000
    demos_per_task: int = 12
    demo_seed: int = 0
    demo_timeout_s: float = 60.0
    improve_pairs_per_task: int = 8
    # Improve pairs that edit: up to this many demonstrations are run again with one
    # hyper-parameter changed (same features); where the two scores differ, the weaker one's
    # improve prompt is paired with the stronger one (warmstart.pairs.edit_pairs).
    edit_pairs_per_task: int = 0
    instrument_pairs_per_task: int = 12  # 4 gave 0% LM-instrumenter acceptance, 12 gave 25%
    max_prompt_tokens: int = 384
    max_response_tokens: int = 768
    max_instrument_tokens: int = 1536  # prompt + answer of an instrumentation pair
    # Per task (n tasks: n x steps). Small batches, many steps: better per token than 120 x 8.
    steps: int = 240
    batch_size: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    # The tuned weights are the mean of the last `average_last` share of the steps' weights
    # (stochastic weight averaging over the tail of the schedule); 0: the last step's.
    average_last: float = 0.0
    seed: int = 0
    eval_samples: int = 8
    eval_temperature: float = 0.7
    eval_max_new_tokens: int | None = None  # default: the prompt config's max_response_tokens
    eval_instrument: int = 2  # programs the tuned model is asked to instrument (greedy)
    sandbox_backend: str = "auto"  # "auto" (bwrap if it works), "bwrap", "subprocess"
    workers: int = 2

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None) -> WarmStartConfig:
        d = dict(d or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown warm-start config keys {unknown}; known: {sorted(names)}")
        mo = d.get("model_overrides")
        if mo is not None:  # a dict, ConfigDict or JSON list of pairs -> hashable sorted pairs
            pairs = dict(mo).items() if hasattr(mo, "items") else (tuple(p) for p in mo)
            d["model_overrides"] = tuple(sorted((str(k), v) for k, v in pairs))
        return cls(**d)

    def __post_init__(self):
        if self.edit_pairs_per_task < 0:
            raise ValueError(f"warm start edit_pairs_per_task must be >= 0, got "
                             f"{self.edit_pairs_per_task}")
        if not 0.0 <= self.average_last < 1.0:
            raise ValueError(f"warm start average_last must be in [0, 1), got "
                             f"{self.average_last}")
