"""The warm start's spread between builds (experiments/warmstart_spread.py): the statistic
against a plain reference, and the study config's variants as warm-start settings."""

import copy
import math

import pytest

from configs import warmstart_spread
from rl4mle_jax.warmstart.check import spread_over_builds
from rl4mle_jax.warmstart.config import WarmStartConfig


def test_spread_over_builds_against_a_plain_reference():
    rates, n = [22 / 32, 16 / 32, 11 / 32], 32
    mean = sum(rates) / 3
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / 2)
    sampling = math.sqrt(sum(r * (1 - r) for r in rates) / 3 / n)
    got = spread_over_builds(rates, n)
    assert got["mean"] == pytest.approx(mean) and got["sd"] == pytest.approx(sd)
    assert got["sampling_sd"] == pytest.approx(sampling)
    assert got["build_sd"] == pytest.approx(math.sqrt(sd ** 2 - sampling ** 2))
    assert (got["min"], got["max"], got["builds"]) == (11 / 32, 22 / 32, 3)
    # Builds no further apart than their draws: nothing left between builds.
    assert spread_over_builds([0.5, 0.52], 32)["build_sd"] == 0.0
    one = spread_over_builds([0.5], 8)
    assert math.isnan(one["sd"]) and math.isnan(one["build_sd"])
    assert one["sampling_sd"] == pytest.approx(math.sqrt(0.25 / 8))


def test_every_variant_is_a_warm_start_setting_the_loop_accepts():
    from rl4mle_jax.components import validate_config

    c = warmstart_spread.get_config("diamonds-cut,tweet-source")
    assert set(c.improve_variants) <= set(c.variants) and "default" in c.variants
    for name, overrides in c.variants.items():
        cfg = copy.deepcopy(c.base)
        cfg.task = "diamonds-cut"
        cfg.mesh.data = 1
        cfg.warmstart.settings.update({**dict(overrides), "seed": 2})
        validate_config(cfg)  # what evaluate_build builds from
        ws = WarmStartConfig.from_mapping({**dict(cfg.warmstart.settings)})
        assert ws.seed == 2 and all(getattr(ws, k) == v for k, v in overrides.items()), name
