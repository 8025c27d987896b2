"""The warm start's cache: the key (everything the result depends on) and loading a result."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl4mle_jax.models import Qwen2Config, load_hf_checkpoint
from rl4mle_jax.warmstart.config import WarmStartConfig
from rl4mle_jax.warmstart.demo_runs import load_demos
from rl4mle_jax.warmstart.demos import DEMO_SET_VERSION

WARMSTART_VERSION = "1"
Params = Any


@dataclasses.dataclass
class WarmStart:
    """A warm-started policy: config + params, and the HF directory they were saved to."""

    model_config: Qwen2Config
    params: Params
    hf_dir: Path  # config.json, model.safetensors, tokenizer files
    demos: list  # list[demo_runs.Demo]
    stats: dict
    cached: bool = False

    @property
    def tokenizer_dir(self) -> Path:
        return self.hf_dir


# ----------------------------------------------------------------------------- cache


def cache_key(task_ids: Sequence[str], config: WarmStartConfig, extra: Mapping | None = None
              ) -> str:
    """Hash of everything the warm start depends on (tasks, config, demo generator, prompts)."""
    blob = json.dumps({"tasks": list(task_ids), "config": dataclasses.asdict(config),
                       "demo_set": DEMO_SET_VERSION, "version": WARMSTART_VERSION,
                       "extra": extra or {}}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_warmstart(path: str | os.PathLike) -> WarmStart:
    """Load a finished warm-start directory (the one `build_warmstart` returns)."""
    path = Path(path)
    if not (path / "DONE").exists():
        raise FileNotFoundError(f"{path} is not a finished warm start (no DONE file)")
    config, params = load_hf_checkpoint(path / "hf")
    stats = json.loads((path / "stats.json").read_text())
    return WarmStart(config, params, path / "hf", load_demos(path / "demos.jsonl"),
                     stats, cached=True)
