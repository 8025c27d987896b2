"""Duration-aware weights against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.rl.duration import duration_weights

DURATIONS = np.array([1.0, 10.0, 0.5, 300.0, 2.0], np.float32)
VALID = np.array([1, 1, 1, 1, 0], np.float32)  # last row: padding of a batch bucket


def _reference(durations, mode, valid):
    x = durations.astype(np.float64)
    if mode == "off":
        return valid.astype(np.float64)
    if mode == "log1p":
        x = np.log1p(x)
    real = [x[i] for i in range(len(x)) if valid[i]]
    mean = sum(real) / len(real)
    return np.array([x[i] / mean if valid[i] else 0.0 for i in range(len(x))])


@pytest.mark.parametrize("mode", ["off", "batch_mean", "log1p"])
def test_weights_match_numpy(mode):
    w = duration_weights(jnp.asarray(DURATIONS), mode, valid_b=jnp.asarray(VALID))
    np.testing.assert_allclose(np.asarray(w), _reference(DURATIONS, mode, VALID), rtol=1e-6)
    # Weights average to one over the real rows, whatever the mode.
    np.testing.assert_allclose(np.asarray(w)[:4].mean(), 1.0, rtol=1e-6)


def test_weights_under_jit_and_hyphenated_mode():
    w_jit = jax.jit(lambda d: duration_weights(d, "batch-mean"))(jnp.asarray(DURATIONS))
    np.testing.assert_allclose(np.asarray(w_jit), DURATIONS / DURATIONS.mean(), rtol=1e-6)


def test_equal_durations_give_unit_weights_and_cap_applies():
    np.testing.assert_allclose(np.asarray(duration_weights(jnp.full((4,), 7.3))), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(duration_weights(jnp.zeros((3,)))), 1.0)
    w = duration_weights(jnp.asarray([1.0, 1.0, 1.0, 97.0]), max_weight=2.0)
    np.testing.assert_allclose(np.asarray(w), [0.04, 0.04, 0.04, 2.0], rtol=1e-5)


def test_bad_inputs_name_the_tensor():
    with pytest.raises(ValueError, match="durations_b must be finite and >= 0"):
        duration_weights(jnp.asarray([1.0, -2.0]))
    with pytest.raises(ValueError, match="durations_b must be finite"):
        duration_weights(jnp.asarray([1.0, np.nan]))
    with pytest.raises(ValueError, match="duration weight mode 'linear' is not one of"):
        duration_weights(jnp.ones(3), "linear")
    with pytest.raises(AssertionError, match="durations_b must be"):
        duration_weights(jnp.ones((2, 3)))
    with pytest.raises(AssertionError, match="valid_b vs durations_b"):
        duration_weights(jnp.ones(3), valid_b=jnp.ones(4))


def _inverse_inclusion_reference(inclusion, valid):
    inv = [1.0 / inclusion[i] for i in range(len(inclusion)) if valid[i]]
    mean = sum(inv) / len(inv)
    return np.array([1.0 / inclusion[i] / mean if valid[i] else 0.0
                     for i in range(len(inclusion))])


def test_inverse_inclusion_matches_numpy_and_its_two_limits():
    p = np.array([0.9, 0.05, 1.0, 0.3, 0.0], np.float32)  # padding row may hold anything
    w = duration_weights(jnp.asarray(DURATIONS), "inverse_inclusion", valid_b=jnp.asarray(VALID),
                         inclusion_b=jnp.asarray(p))
    np.testing.assert_allclose(np.asarray(w), _inverse_inclusion_reference(p, VALID), rtol=1e-6)
    # Nothing lost (p constant): every weight is 1.
    w = duration_weights(jnp.asarray(DURATIONS), "inverse-inclusion",
                         inclusion_b=jnp.full((5,), 0.37))
    np.testing.assert_allclose(np.asarray(w), 1.0, rtol=1e-6)
    # The paper's premise (p ∝ 1/Δt): the paper's weight Δt/mean(Δt), under jit too.
    p_premise = jnp.asarray(0.5 / DURATIONS)
    w = jax.jit(lambda d, q: duration_weights(d, "inverse_inclusion", inclusion_b=q))(
        jnp.asarray(DURATIONS), p_premise)
    np.testing.assert_allclose(np.asarray(w), np.asarray(duration_weights(DURATIONS)), rtol=1e-5)


def test_inverse_inclusion_bad_inputs():
    with pytest.raises(ValueError, match="'inverse_inclusion' needs inclusion_b"):
        duration_weights(jnp.ones(3), "inverse_inclusion")
    for bad in (0.0, 1.5, np.nan):
        with pytest.raises(ValueError, match=r"inclusion_b must be in \(0, 1\] on valid rows"):
            duration_weights(jnp.ones(3), "inverse_inclusion",
                             inclusion_b=jnp.asarray([0.5, bad, 1.0]))
    with pytest.raises(AssertionError, match="inclusion_b vs durations_b"):
        duration_weights(jnp.ones(3), "inverse_inclusion", inclusion_b=jnp.ones(4))


def test_batch_requires_inclusion_for_inverse_inclusion():
    from rl4mle_jax.rl.batch import prepare_batch, required_batch_keys
    from rl4mle_jax.rl.learner_config import LearnerConfig

    cfg = LearnerConfig(duration_weighting="inverse_inclusion")
    assert "inclusion" in required_batch_keys(cfg)
    assert "inclusion" not in required_batch_keys(LearnerConfig())
    b, t = 2, 3
    batch = {"tokens": np.zeros((b, t), np.int32), "attention_mask": np.ones((b, t)),
             "response_mask": np.ones((b, t)), "old_logprobs": np.zeros((b, t)),
             "rewards": np.zeros(b), "dt_s": np.ones(b)}
    with pytest.raises(KeyError, match=r"batch is missing \['inclusion'\]"):
        prepare_batch(batch, cfg)
    with pytest.raises(ValueError, match=r"batch\['inclusion'\] must be in \(0, 1\]"):
        prepare_batch({**batch, "inclusion": np.array([0.5, 0.0])}, cfg)
    assert prepare_batch({**batch, "inclusion": np.array([0.5, 1.0])}, cfg)["inclusion"].dtype \
        == np.float32
