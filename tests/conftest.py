"""Test-wide set-up: 8 virtual CPU devices for sharding tests (set before jax is imported)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from tests.warm import warm_config  # noqa: E402


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory):
    """Builds the shared warm start (tests/warm.py) once per session (~3 min); the tests that
    run the loop or the filter load it from this cache."""
    from rl4mle_jax.components import build_components

    cache = tmp_path_factory.mktemp("warmstart")
    build_components(warm_config(cache), cache / "unused")
    return cache
