"""JAX's persistent compilation cache for the entry points (experiments/*.py, scripts that run
the loop): a later process with the same programs (another seed, a resume, the next run of a
sweep) loads the XLA executables from disk instead of compiling them again.

On 2 CPU cores the loop's train step takes 15-25 s to compile and a sampler program 1-12 s; in
a cold process those compiles fall inside the RL clock (or, with `run.warmup`, just before it).
The cache is keyed by JAX itself (the program, the compile options, the jax/jaxlib versions and
the backend), so an entry is never used for another program, flag set or device kind.

  $RL4MLE_JAX_CACHE  the directory (default ~/.cache/rl4mle_jax/jax); "off" turns it off
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

log = logging.getLogger(__name__)

ENV = "RL4MLE_JAX_CACHE"
DEFAULT_DIR = "~/.cache/rl4mle_jax/jax"
OFF = ("", "off", "0", "none", "false")
# Programs that compile faster than this are not written (the sandbox's small jits, eager ops).
MIN_COMPILE_TIME_S = 0.5


def is_off(setting: str) -> bool:
    """Whether a setting of $RL4MLE_JAX_CACHE (or `enable`'s path) turns the cache off."""
    return setting.strip().lower() in OFF


def enable(path: str | None = None) -> Path | None:
    """Turns the cache on at `path` (None: $RL4MLE_JAX_CACHE, else ~/.cache/rl4mle_jax/jax) and
    returns the directory, or None where the setting is "off". Call it before the first compile
    of the process: JAX reads the directory when it first compiles."""
    raw = os.environ.get(ENV, DEFAULT_DIR) if path is None else path
    if is_off(raw):
        log.info("JAX compilation cache: off (%s=%r)", ENV, raw)
        return None
    directory = Path(raw).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"JAX compilation cache: cannot create {directory} ({e}); set {ENV} to a "
                      f"writable directory, or {ENV}=off") from e
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    log.info("JAX compilation cache: %s", directory)
    return directory
