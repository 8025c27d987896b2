"""The warm start (placeholder __init__, being split into a package)."""

import importlib

from rl4mle_jax.warmstart.config import WarmStartConfig, default_warmstart_dir

__all__ = ["WarmStartConfig", "default_warmstart_dir"]


def __getattr__(name):  # PEP 562: the JAX-using parts load on first use
    if name.startswith("__"):
        raise AttributeError(name)
    build = importlib.import_module("rl4mle_jax.warmstart.build")
    try:
        return getattr(build, name)
    except AttributeError:
        raise AttributeError(f"module 'rl4mle_jax.warmstart' has no attribute {name!r}") from None
