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
