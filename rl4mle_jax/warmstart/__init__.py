"""Warm start of the embedded default: a tiny Qwen2 fine-tuned on demonstrations, cached.

One job per module:
  config.py     WarmStartConfig, default_warmstart_dir (no JAX: config files import it)
  demos.py      demonstration programs generated from a task's public files
  demo_runs.py  each program run and graded in the sandbox (the Demo record), saved/loaded
  pairs.py      SFT pairs: solve / improve prompts (env.prompts) and instrumentation answers
  sft.py        encode, batch, loss, step (make_sft_step) and the fine-tuning loop
  check.py      after tuning: sample-and-run (the paper's filter) and the instrument accept rate
  cache.py      the cache key, the WarmStart result and load_warmstart
  build.py      build_warmstart (demos -> tokenizer -> SFT -> check -> save), task_demos

Importing the package imports no JAX; the names below load their module on first use.
"""

import importlib

from rl4mle_jax.warmstart.config import WarmStartConfig, default_warmstart_dir

_LAZY = {
    "build_warmstart": "build", "make_sandbox": "build", "task_demos": "build",
    "WARMSTART_VERSION": "cache", "WarmStart": "cache", "cache_key": "cache",
    "load_warmstart": "cache",
    "SFTExample": "sft", "encode_pairs": "sft", "make_batch": "sft", "make_sft_step": "sft",
    "sft_loss": "sft", "train_sft": "sft",
    "plain_solve_prompt": "pairs", "training_pairs": "pairs",
    "instrumentation_pairs": "pairs", "lm_instrumented": "pairs",
    "instrument_accept_rate": "check", "sample_and_run": "check",
    "Demo": "demo_runs", "load_demos": "demo_runs", "make_demos": "demo_runs",
    "save_demos": "demo_runs",
    "DEMO_SET_VERSION": "demos", "DemoProgram": "demos", "generate_programs": "demos",
}
__all__ = ["WarmStartConfig", "default_warmstart_dir", *_LAZY]


def __getattr__(name: str):  # PEP 562: a JAX-using module loads when one of its names is used
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
