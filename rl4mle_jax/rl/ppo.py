"""PPO losses for language models as pure functions over [B, T] arrays.

Conventions (the learner batch contract):
- position t of every [B, T] array describes token t of prompt + response; log-prob arrays hold
  log p(tokens[t] | tokens[<t]) at position t;
- `response_mask_bt` is 1 on the response tokens that count, 0 on prompt and padding;
- every loss returns `(scalar_loss, metrics)` with metrics a flat dict of float32 scalars;
- `sample_weights_b` are per-sample weights (the duration-aware weights of `rl.duration`);
  they multiply the policy-gradient term only, never the value, entropy or KL terms.

Micro-batching: pass `normalizer=aggregation_normalizer(full_mask_bt, mode)` computed on the
whole batch to each micro-batch's loss; the micro-batch losses then sum to the full-batch loss
exactly (and so do their gradients).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

from rl4mle_jax.rl.learner_config import AGG_MODES, ENTROPY_SCHEDULES, KL_ESTIMATORS

Metrics = dict[str, jax.Array]


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"agg_mode {mode!r} is not one of {AGG_MODES}")


def _check_bt(ref_name: str, ref: jax.Array, **others: jax.Array | None) -> None:
    chex.assert_rank(ref, 2, custom_message=f"{ref_name} must be [B, T]")
    for name, x in others.items():
        if x is not None:
            chex.assert_shape(x, ref.shape, custom_message=f"{name} must match {ref_name}")


def masked_mean(x_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Mean of x over the positions where mask is 1 (0 when the mask is empty)."""
    mask = mask_bt.astype(jnp.float32)
    return jnp.sum(x_bt * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def aggregation_normalizer(response_mask_bt: jax.Array, mode: str = "token-mean") -> jax.Array:
    """Denominator of `aggregate`: the token count (token-mean) or the number of non-empty rows."""
    _check_mode(mode)
    mask = response_mask_bt.astype(jnp.float32)
    if mode == "token-mean":
        return jnp.sum(mask)
    return jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))


def aggregate(
    loss_bt: jax.Array,
    response_mask_bt: jax.Array,
    mode: str = "token-mean",
    sample_weights_b: jax.Array | None = None,
    normalizer: jax.Array | float | None = None,
) -> jax.Array:
    """Reduce a per-token loss to a scalar, weighting sample i by w_i before the reduction.

    With m the response mask, len_i = Σ_t m_it, N = Σ_it m_it, S = #{i : len_i > 0}:

        token-mean:          Σ_i w_i Σ_t m_it ℓ_it / N
        seq-mean-token-mean: Σ_i w_i (Σ_t m_it ℓ_it / len_i) / S
        seq-mean-token-sum:  Σ_i w_i (Σ_t m_it ℓ_it) / S

    The denominators are the unweighted N and S (not Σ_i w_i len_i): the loss is linear in w,
    so its gradient is exactly Σ_i w_i ∇L_i with L_i sample i's vanilla contribution, and all
    w_i = 1 gives back the vanilla loss. The weight never grows with response length: ∂loss/∂ℓ_it
    is w_i/N, w_i/(len_i S) and w_i/S respectively, so in the seq-mean modes sample i enters with
    coefficient w_i/S whatever its length, and in token-mean the length dependence is that of
    token-mean itself (a longer sample has more tokens), multiplied by w_i once.

    Args:
      normalizer: overrides N or S; pass the full batch's value when summing micro-batches.
    """
    _check_mode(mode)
    _check_bt("response_mask_bt", response_mask_bt, loss_bt=loss_bt)
    mask = response_mask_bt.astype(jnp.float32)
    if normalizer is None:
        normalizer = aggregation_normalizer(mask, mode)
    normalizer = jnp.maximum(jnp.asarray(normalizer, jnp.float32), 1.0)
    seq_sum_b = jnp.sum(loss_bt * mask, axis=-1)
    if mode == "seq-mean-token-mean":
        seq_b = seq_sum_b / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)
    else:  # token-mean and seq-mean-token-sum share the numerator, differ in the denominator
        seq_b = seq_sum_b
    if sample_weights_b is not None:
        chex.assert_shape(sample_weights_b, (loss_bt.shape[0],),
                          custom_message="sample_weights_b must be [B]")
        seq_b = seq_b * sample_weights_b.astype(jnp.float32)
    return jnp.sum(seq_b) / normalizer


def policy_loss(
    logprobs_bt: jax.Array,
    old_logprobs_bt: jax.Array,
    advantages_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    agg_mode: str = "token-mean",
    sample_weights_b: jax.Array | None = None,
    normalizer: jax.Array | float | None = None,
    log_ratio_clip: float = 20.0,
    token_weights_bt: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
    """Clipped PPO surrogate, ratio against `old_logprobs_bt` (the behaviour log-probs recorded
    at sampling time, or the proximal ones under an off-policy correction).

    PPO's L^CLIP (Schulman et al. 2017, eq. 7), with asymmetric clipping (clip_eps_high) and
    the dual clip for negative advantages (Ye et al. 2020); the paper trains with PPO, ε = 0.2.

    ℓ_t = max(−A·r, −A·clip(r, 1−ε, 1+ε_high)) with r = exp(clip(logp − old, ±log_ratio_clip));
    with dual clip (c > 1, e.g. 3) tokens with A < 0 use min(ℓ_t, −A·c) so a huge ratio on a bad
    token cannot blow the loss up. `sample_weights_b` (DAG weights) act as in `aggregate`;
    `token_weights_bt` (the behaviour weights of `rl.off_policy`, no gradient) multiply ℓ_t.
    """
    _check_bt("logprobs_bt", logprobs_bt, old_logprobs_bt=old_logprobs_bt,
              advantages_bt=advantages_bt, response_mask_bt=response_mask_bt,
              token_weights_bt=token_weights_bt)
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = response_mask_bt.astype(jnp.float32)
    adv = advantages_bt.astype(jnp.float32)
    log_ratio = jnp.clip(logprobs_bt.astype(jnp.float32) - old_logprobs_bt.astype(jnp.float32),
                         -log_ratio_clip, log_ratio_clip)
    ratio = jnp.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    pg = jnp.maximum(pg_unclipped, pg_clipped)
    metrics: Metrics = {"pg_clipfrac": masked_mean((pg_clipped > pg_unclipped).astype(jnp.float32),
                                                   mask)}
    if dual_clip_c is not None:
        pg_dual = jnp.minimum(pg, -adv * dual_clip_c)
        metrics["pg_clipfrac_lower"] = masked_mean(
            ((pg > pg_dual) & (adv < 0)).astype(jnp.float32), mask)
        pg = jnp.where(adv < 0, pg_dual, pg)
    if token_weights_bt is not None:
        pg = pg * jax.lax.stop_gradient(token_weights_bt.astype(jnp.float32))
    loss = aggregate(pg, mask, agg_mode, sample_weights_b, normalizer)
    has_tokens = jnp.sum(mask) > 0
    metrics.update({
        "pg_loss": loss,
        # KL(behaviour || current) estimated on the behaviour samples (k1 and k3).
        "approx_kl": masked_mean(-log_ratio, mask),
        "approx_kl_k3": masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
        "ratio_max": jnp.where(has_tokens, jnp.max(jnp.where(mask > 0, ratio, -jnp.inf)), 1.0),
        "ratio_min": jnp.where(has_tokens, jnp.min(jnp.where(mask > 0, ratio, jnp.inf)), 1.0),
    })
    return loss, metrics


def value_loss(
    values_bt: jax.Array,
    values_old_bt: jax.Array,
    returns_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    clip_eps: float | None = 0.5,
    agg_mode: str = "token-mean",
    normalizer: jax.Array | float | None = None,
) -> tuple[jax.Array, Metrics]:
    """Clipped value loss 0.5·max((v − R)², (clip(v, v_old ± ε_v) − R)²); ε_v None: unclipped.

    PPO's value term (Schulman et al. 2017, eq. 9) with the value clipping of OpenAI's ppo2
    (examined in Engstrom et al. 2020, §3).
    """
    _check_bt("values_bt", values_bt, values_old_bt=values_old_bt, returns_bt=returns_bt,
              response_mask_bt=response_mask_bt)
    mask = response_mask_bt.astype(jnp.float32)
    v = values_bt.astype(jnp.float32)
    ret = returns_bt.astype(jnp.float32)
    loss_unclipped = jnp.square(v - ret)
    if clip_eps is None:
        loss_bt = 0.5 * loss_unclipped
        clipfrac = jnp.zeros((), jnp.float32)
    else:
        v_old = values_old_bt.astype(jnp.float32)
        v_clipped = v_old + jnp.clip(v - v_old, -clip_eps, clip_eps)
        loss_clipped = jnp.square(v_clipped - ret)
        loss_bt = 0.5 * jnp.maximum(loss_unclipped, loss_clipped)
        # Only where v left the clip range can the clipped loss differ; without that gate,
        # rounding in v_old + (v - v_old) flips the comparison between device layouts.
        clipped = (jnp.abs(v - v_old) > clip_eps) & (loss_clipped > loss_unclipped)
        clipfrac = masked_mean(clipped.astype(jnp.float32), mask)
    loss = aggregate(loss_bt, mask, agg_mode, None, normalizer)
    ret_mean = masked_mean(ret, mask)
    ret_var = masked_mean(jnp.square(ret - ret_mean), mask)
    err_var = masked_mean(jnp.square(ret - v - masked_mean(ret - v, mask)), mask)
    return loss, {
        "vf_loss": loss,
        "vf_clipfrac": clipfrac,
        "vpred_mean": masked_mean(v, mask),
        "vf_explained_var": 1.0 - err_var / jnp.maximum(ret_var, 1e-8),
    }


def entropy_from_logits(logits_btv: jax.Array) -> jax.Array:
    """Entropy [B, T] (float32) of softmax(logits) along the last axis."""
    logits = logits_btv.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_bonus(
    entropy_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    agg_mode: str = "token-mean",
    normalizer: jax.Array | float | None = None,
) -> tuple[jax.Array, Metrics]:
    """Aggregated entropy (to be SUBTRACTED from the loss times the scheduled coefficient)."""
    _check_bt("entropy_bt", entropy_bt, response_mask_bt=response_mask_bt)
    ent = aggregate(entropy_bt, response_mask_bt, agg_mode, None, normalizer)
    return ent, {"entropy": ent}


def entropy_coef_schedule(
    init_coef: float,
    end_coef: float = 0.0,
    decay_steps: int = 0,
    kind: str = "linear",
) -> optax.Schedule:
    """Entropy coefficient as a function of the update step: "constant", "linear" or "cosine"."""
    if kind == "constant" or decay_steps <= 0:
        return optax.constant_schedule(init_coef)
    if kind == "linear":
        return optax.linear_schedule(init_coef, end_coef, decay_steps)
    if kind == "cosine":
        alpha = end_coef / init_coef if init_coef else 0.0
        return optax.cosine_decay_schedule(init_coef, decay_steps, alpha=alpha)
    raise ValueError(f"entropy schedule kind {kind!r} is not one of {ENTROPY_SCHEDULES}")


def kl_penalty(
    logprobs_bt: jax.Array,
    ref_logprobs_bt: jax.Array,
    kind: str = "k3",
    log_ratio_clip: float = 20.0,
    max_k3: float = 10.0,
) -> jax.Array:
    """Per-token estimate of KL(π || π_ref) on tokens sampled from π (Schulman 2020,
    "Approximating KL Divergence": the estimators k1, k2, k3).

    k1 = logp − ref (unbiased, can be negative); k2 = ½(logp − ref)²;
    k3 ("low_var_kl") = exp(ref − logp) − (ref − logp) − 1 ≥ 0, clamped to [0, max_k3].
    """
    _check_bt("logprobs_bt", logprobs_bt, ref_logprobs_bt=ref_logprobs_bt)
    diff = logprobs_bt.astype(jnp.float32) - ref_logprobs_bt.astype(jnp.float32)
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * jnp.square(diff)
    if kind in ("k3", "low_var_kl"):
        log_r = jnp.clip(-diff, -log_ratio_clip, log_ratio_clip)
        return jnp.clip(jnp.exp(log_r) - log_r - 1.0, 0.0, max_k3)
    raise ValueError(f"kl estimator {kind!r} is not one of {KL_ESTIMATORS}")


def kl_loss(
    logprobs_bt: jax.Array,
    ref_logprobs_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    kind: str = "k3",
    agg_mode: str = "token-mean",
    normalizer: jax.Array | float | None = None,
) -> tuple[jax.Array, Metrics]:
    """KL to the frozen reference as a loss term (the other option: `advantages.token_rewards`)."""
    kl_bt = kl_penalty(logprobs_bt, ref_logprobs_bt, kind)
    loss = aggregate(kl_bt, response_mask_bt, agg_mode, None, normalizer)
    return loss, {"kl_loss": loss}


def actor_loss(
    logprobs_bt: jax.Array,
    old_logprobs_bt: jax.Array,
    advantages_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    sample_weights_b: jax.Array | None = None,
    entropy_bt: jax.Array | None = None,
    entropy_coef: jax.Array | float = 0.0,
    ref_logprobs_bt: jax.Array | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
    agg_mode: str = "token-mean",
    normalizer: jax.Array | float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    token_weights_bt: jax.Array | None = None,
    pg_coef: float = 1.0,
) -> tuple[jax.Array, Metrics]:
    """pg_coef·pg_loss(w) − entropy_coef·entropy + kl_coef·KL(π || π_ref): the policy's whole
    loss (pg_coef is 1 but in a control that trains without the reward; the metrics keep the
    unscaled pg_loss).

    `entropy_coef` is the schedule's value at the current step (`entropy_coef_schedule(...)(step)`).
    The KL term is added only when `ref_logprobs_bt` is given and kl_coef > 0.
    `token_weights_bt` (off-policy behaviour weights) multiply the policy-gradient term only.
    """
    loss, metrics = policy_loss(
        logprobs_bt, old_logprobs_bt, advantages_bt, response_mask_bt,
        clip_eps=clip_eps, clip_eps_high=clip_eps_high, dual_clip_c=dual_clip_c,
        agg_mode=agg_mode, sample_weights_b=sample_weights_b, normalizer=normalizer,
        token_weights_bt=token_weights_bt)
    loss = pg_coef * loss
    if entropy_bt is not None:
        ent, ent_metrics = entropy_bonus(entropy_bt, response_mask_bt, agg_mode=agg_mode,
                                         normalizer=normalizer)
        loss = loss - entropy_coef * ent
        metrics.update(ent_metrics)
        metrics["entropy_coef"] = jnp.asarray(entropy_coef, jnp.float32)
    if ref_logprobs_bt is not None and kl_coef > 0.0:
        kl, kl_metrics = kl_loss(logprobs_bt, ref_logprobs_bt, response_mask_bt, kind=kl_kind,
                                 agg_mode=agg_mode, normalizer=normalizer)
        loss = loss + kl_coef * kl
        metrics.update(kl_metrics)
    metrics["actor_loss"] = loss
    return loss, metrics

