"""Test-wide set-up: 8 virtual CPU devices for sharding tests (set before jax is imported)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from tests.warm import warm_config  # noqa: E402

_JAX_CACHE: list[str] = []


def pytest_configure(config):
    """One persistent compilation cache for the session, this process and the entry points it
    starts (they read $RL4MLE_JAX_CACHE): the many loops on the same tiny model compile each
    program once. A fresh directory per session (removed at its end): no test reads an
    executable from another run."""
    from rl4mle_jax import compile_cache

    if compile_cache.ENV in os.environ and compile_cache.is_off(os.environ[compile_cache.ENV]):
        return  # RL4MLE_JAX_CACHE=off: the session compiles everything itself
    d = tempfile.mkdtemp(prefix="rl4mle-test-jax-cache-")
    _JAX_CACHE.append(d)
    os.environ[compile_cache.ENV] = d
    compile_cache.enable(d)


def pytest_unconfigure(config):
    for d in _JAX_CACHE:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory):
    """Builds the shared warm start (tests/warm.py) once per session (~3 min); the tests that
    run the loop or the filter load it from this cache."""
    from rl4mle_jax.components import build_components

    cache = tmp_path_factory.mktemp("warmstart")
    build_components(warm_config(cache), cache / "unused")
    return cache
