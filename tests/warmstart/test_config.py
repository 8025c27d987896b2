"""Warm-start settings: the JAX-free config module."""

import subprocess
import sys

import pytest

from rl4mle_jax import warmstart as ws


def test_config_from_mapping_names_unknown_keys():
    cfg = ws.WarmStartConfig.from_mapping({"steps": 3, "model_overrides": {"hidden_size": 64}})
    assert cfg.steps == 3 and cfg.model_overrides == (("hidden_size", 64),)
    with pytest.raises(ValueError, match=r"unknown warm-start config keys \['stepz'\]"):
        ws.WarmStartConfig.from_mapping({"stepz": 3})


def test_config_module_and_package_import_no_jax():
    code = ("import sys, rl4mle_jax.warmstart.config, rl4mle_jax.warmstart as w\n"
            "assert w.WarmStartConfig is rl4mle_jax.warmstart.config.WarmStartConfig\n"
            "import rl4mle_jax.warmstart.demos, rl4mle_jax.warmstart.demo_runs\n"
            "import rl4mle_jax.warmstart.pairs\n"
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_package_names_load_lazily_and_unknown_names_fail():
    assert ws.build_warmstart.__module__ == "rl4mle_jax.warmstart.build"
    assert ws.make_sft_step.__module__ == "rl4mle_jax.warmstart.sft"
    with pytest.raises(AttributeError, match="no attribute 'make_train_step'"):
        ws.make_train_step  # noqa: B018
