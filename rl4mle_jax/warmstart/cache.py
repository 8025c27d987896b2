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

WARMSTART_VERSION = "3"  # bump when the prompts or the build change (3: prompt.trim_first;
# "imports" builds the prompts of version 2)
# Config fields added since version 3, with the value that builds what version 3 built: they
# enter the key only when set otherwise, so adding one does not rebuild every cached warm start.
ADDED_AFTER_V3 = {"average_last": 0.0, "edit_pairs_per_task": 0}
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
    conf = dataclasses.asdict(config)
    for name, neutral in ADDED_AFTER_V3.items():  # absent at its neutral value: older keys hold
        if conf[name] == neutral:
            del conf[name]
    blob = json.dumps({"tasks": list(task_ids), "config": conf,
                       "demo_set": DEMO_SET_VERSION, "version": WARMSTART_VERSION,
                       "extra": extra or {}}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def changed_since_cached(out_dir: str | os.PathLike, prints: Mapping[str, Mapping]
                         ) -> list[str]:
    """For each task whose id has a finished warm start in `out_dir` built from other content,
    one line naming the files that differ (so a rebuild says why). `prints`: task id ->
    `Task.fingerprint()`."""
    latest: dict[str, tuple[float, str, dict]] = {}
    for stats_p in Path(out_dir).glob("warmstart-*/stats.json"):
        if not (stats_p.parent / "DONE").exists():
            continue
        try:
            files = json.loads(stats_p.read_text()).get("task_files") or {}
        except (OSError, ValueError):
            continue
        for tid, old in files.items():
            mtime = stats_p.stat().st_mtime
            if tid in prints and mtime > latest.get(tid, (-1.0, "", {}))[0]:
                latest[tid] = (mtime, stats_p.parent.name, old)
    out = []
    for tid, (_, name, old) in sorted(latest.items()):
        new = prints[tid]["files"]
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if diff:
            shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
            out.append(f"task {tid!r} changed since {name} ({shown})")
    return out


def load_warmstart(path: str | os.PathLike) -> WarmStart:
    """Load a finished warm-start directory (the one `build_warmstart` returns)."""
    path = Path(path)
    if not (path / "DONE").exists():
        raise FileNotFoundError(f"{path} is not a finished warm start (no DONE file)")
    config, params = load_hf_checkpoint(path / "hf")
    stats = json.loads((path / "stats.json").read_text())
    return WarmStart(config, params, path / "hf", load_demos(path / "demos.jsonl"),
                     stats, cached=True)
