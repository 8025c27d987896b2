"""Duration-aware gradient (DAG) weights: one weight per sample from its execution time Δt.

In asynchronous RL a sample that takes Δt seconds comes back at a rate ∝ π(x)/Δt_x, so its
policy-gradient term is over-counted by 1/Δt. Multiplying each sample's term by Δt (rescaled
so that the weights average to one over the batch) cancels this:

    "off":        w_i = 1
    "batch_mean": w_i = Δt_i / mean_j(Δt_j)
    "log1p":      w_i = log1p(Δt_i) / mean_j(log1p(Δt_j))     (a softer correction)
    "inverse_inclusion": w_i = (1/p_i) / mean_j(1/p_j)

p_i is the estimated probability that an episode of sample i's Δt, once started, reaches the
learner (`rl.arrival.ArrivalModel`, the batch's `inclusion`). It corrects what the loop's
arrivals actually lose: w = 1 when nothing is lost (p constant), and w = Δt/mean(Δt), the
paper's weight, when p ∝ 1/Δt (the paper's premise).

The mean runs over the valid rows of the batch (`valid_b`), so padding rows added to fill a
batch bucket do not change the weights of the real ones. The weights depend on Δt only, never
on response length; how they enter the loss is documented in `ppo.aggregate`.
Compute them once on the full batch (not per micro-batch) so accumulation stays exact.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax.rl.learner_config import DURATION_MODES


def _canonical_mode(mode: str) -> str:
    canon = mode.replace("-", "_")
    if canon not in DURATION_MODES:
        raise ValueError(f"duration weight mode {mode!r} is not one of {DURATION_MODES}")
    return canon


def duration_weights(
    durations_b: jax.Array,
    mode: str = "batch_mean",
    valid_b: jax.Array | None = None,
    max_weight: float | None = None,
    inclusion_b: jax.Array | None = None,
) -> jax.Array:
    """Per-sample DAG weights [B] (float32) that average to 1 over the valid rows.

    Paper ("Reinforcement Learning for Machine Learning Engineering Agents", ICLR 2026),
    duration-aware gradient: ∇J = E[Σ_k Δt_k · ∇log π(a_k|s_k) · Â(s_k, a_k)], with Δt_k
    rescaled by the batch mean ("batch_mean"). What Δt is (the episode's dispatch-to-return
    wall-clock by default, or the program's execution time) is `run.duration_source`, defined
    once in `rollout.collate.episode_durations`. The weight enters the loss in `ppo.aggregate`.

    Args:
      durations_b: Δt of each episode in seconds, >= 0: the learner batch's `dt_s`.
      mode: "off", "batch_mean" (the paper's), "log1p" or "inverse_inclusion"; hyphens are
        accepted too ("batch-mean").
      valid_b: optional [B] bool/0-1 mask of real rows; invalid rows get weight 0.
      max_weight: optional cap applied after normalisation (None: no cap, as in the paper).
      inclusion_b: [B] inclusion probabilities in (0, 1] (the batch's `inclusion`); required by
        "inverse_inclusion" and only used there. Padding rows may hold any value.
    """
    mode = _canonical_mode(mode)
    durations_b = jnp.asarray(durations_b)
    chex.assert_rank(durations_b, 1, custom_message="durations_b must be [B]")
    if not isinstance(durations_b, jax.core.Tracer):
        host = np.asarray(durations_b)
        if not np.all(np.isfinite(host)) or np.any(host < 0):
            raise ValueError(f"durations_b must be finite and >= 0, got {host.tolist()}")
    if valid_b is None:
        valid_b = jnp.ones(durations_b.shape, jnp.float32)
    else:
        chex.assert_equal_shape([durations_b, valid_b], custom_message="valid_b vs durations_b")
        valid_b = jnp.asarray(valid_b).astype(jnp.float32)
    if mode == "off":
        return valid_b
    x_b = durations_b.astype(jnp.float32)
    if mode == "log1p":
        x_b = jnp.log1p(x_b)
    if mode == "inverse_inclusion":
        x_b = 1.0 / _checked_inclusion(inclusion_b, durations_b, valid_b)
    mean = jnp.sum(x_b * valid_b) / jnp.maximum(jnp.sum(valid_b), 1.0)
    # An all-zero batch (every Δt == 0) carries no timing information: fall back to weight 1.
    w_b = jnp.where(mean > 0, x_b / jnp.where(mean > 0, mean, 1.0), 1.0) * valid_b
    if max_weight is not None:
        w_b = jnp.minimum(w_b, max_weight)
    return w_b


def _checked_inclusion(inclusion_b, durations_b: jax.Array, valid_b: jax.Array) -> jax.Array:
    """inclusion_b as float32 [B], with padding rows set to 1; host values must be in (0, 1]."""
    if inclusion_b is None:
        raise ValueError("duration weight mode 'inverse_inclusion' needs inclusion_b (the "
                         "batch's 'inclusion', from rl.arrival.ArrivalModel.inclusion)")
    inclusion_b = jnp.asarray(inclusion_b)
    chex.assert_equal_shape([durations_b, inclusion_b],
                            custom_message="inclusion_b vs durations_b")
    if not isinstance(inclusion_b, jax.core.Tracer) and not isinstance(valid_b, jax.core.Tracer):
        p, real = np.asarray(inclusion_b, np.float64), np.asarray(valid_b) > 0
        bad = real & ~(np.isfinite(p) & (p > 0) & (p <= 1))
        if np.any(bad):
            raise ValueError(f"inclusion_b must be in (0, 1] on valid rows, got "
                             f"{p[bad].tolist()[:10]} in rows {np.nonzero(bad)[0].tolist()[:10]}")
    return jnp.where(valid_b > 0, inclusion_b.astype(jnp.float32), 1.0)
