"""PPO losses against per-token NumPy loops, and the duration-aware weighting's gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.rl import ppo
from rl4mle_jax.rl.duration import duration_weights

# Prompt region 4 (left padded), response region 5 (right padded); row 3 has an empty response.
MASK = np.array([
    [0, 0, 0, 0, 1, 1, 1, 1, 1],
    [0, 0, 0, 0, 1, 1, 1, 0, 0],
    [0, 0, 0, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0],
], np.float32)
B, T, V = MASK.shape[0], MASK.shape[1], 7
MODES = ppo.AGG_MODES


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    logp = np.log(rng.uniform(0.05, 0.9, (B, T))).astype(np.float32)
    old = (logp + rng.normal(0, 0.3, (B, T))).astype(np.float32)  # some tokens clip
    old[0, 4] = logp[0, 4] - 2.0  # a very large ratio (dual clip territory)
    adv = rng.normal(0, 1, (B, T)).astype(np.float32)
    adv[0, 4] = -1.5
    # garbage outside the mask must not leak into anything
    pad = MASK == 0
    logp[pad], old[pad], adv[pad] = 30.0, -30.0, 1e3
    return logp, old, adv


def _np_aggregate(loss, mask, mode, w=None):
    w = np.ones(len(mask)) if w is None else w
    lens = [int(mask[i].sum()) for i in range(len(mask))]
    num, n_tok, n_seq = 0.0, sum(lens), sum(1 for n in lens if n > 0)
    for i in range(len(mask)):
        s = sum(loss[i, t] for t in range(mask.shape[1]) if mask[i, t])
        if mode == "seq-mean-token-mean" and lens[i]:
            s /= lens[i]
        num += w[i] * s
    return num / (n_tok if mode == "token-mean" else n_seq)


def _np_policy_loss(logp, old, adv, mask, mode, eps=0.2, dual_c=None, w=None):
    loss = np.zeros_like(logp, np.float64)
    clipped = []
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            r = math.exp(min(max(logp[i, t] - old[i, t], -20.0), 20.0))
            a = adv[i, t]
            l1, l2 = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
            clipped.append(l2 > l1)
            ell = max(l1, l2)
            if dual_c is not None and a < 0:
                ell = min(ell, -a * dual_c)
            loss[i, t] = ell
    return _np_aggregate(loss, mask, mode, w), np.mean(clipped)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dual_c", [None, 3.0])
def test_policy_loss_matches_numpy(mode, dual_c):
    logp, old, adv = _batch()
    w = np.array([0.5, 2.0, 1.25, 0.25], np.float32)
    for weights in (None, w):
        loss, metrics = ppo.policy_loss(
            jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(MASK),
            agg_mode=mode, dual_clip_c=dual_c,
            sample_weights_b=None if weights is None else jnp.asarray(weights))
        ref, clipfrac = _np_policy_loss(logp, old, adv, MASK, mode, dual_c=dual_c, w=weights)
        np.testing.assert_allclose(float(loss), ref, rtol=1e-5)
        np.testing.assert_allclose(float(metrics["pg_clipfrac"]), clipfrac, rtol=1e-6)
    m = MASK > 0
    ratio = np.exp(logp[m] - old[m])
    np.testing.assert_allclose(float(metrics["ratio_max"]), ratio.max(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio_min"]), ratio.min(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["approx_kl"]), np.mean(old[m] - logp[m]), rtol=1e-5)


def test_dual_clip_bounds_negative_advantage_tokens():
    logp, old, adv = _batch()
    _, m_plain = ppo.policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                                 jnp.asarray(MASK))
    _, m_dual = ppo.policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                                jnp.asarray(MASK), dual_clip_c=3.0)
    # token (0, 4): ratio e^2 ≈ 7.4 > 3 with A < 0, so the dual clip is active there
    assert float(m_dual["pg_clipfrac_lower"]) > 0
    assert "pg_clipfrac_lower" not in m_plain
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo.policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                        jnp.asarray(MASK), dual_clip_c=0.5)


@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_numpy(mode):
    rng = np.random.default_rng(1)
    v, v_old, ret = (rng.normal(0, 1, (B, T)).astype(np.float32) for _ in range(3))
    loss, metrics = ppo.value_loss(jnp.asarray(v), jnp.asarray(v_old), jnp.asarray(ret),
                                   jnp.asarray(MASK), clip_eps=0.5, agg_mode=mode)
    ref = np.zeros((B, T))
    n_clip = 0
    for i in range(B):
        for t in range(T):
            vc = v_old[i, t] + min(max(v[i, t] - v_old[i, t], -0.5), 0.5)
            a, b = (v[i, t] - ret[i, t]) ** 2, (vc - ret[i, t]) ** 2
            ref[i, t] = 0.5 * max(a, b)
            n_clip += bool(MASK[i, t] and abs(v[i, t] - v_old[i, t]) > 0.5 and b > a)
    np.testing.assert_allclose(float(loss), _np_aggregate(ref, MASK, mode), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["vf_clipfrac"]), n_clip / MASK.sum(), rtol=1e-6)
    unclipped, _ = ppo.value_loss(jnp.asarray(v), jnp.asarray(v_old), jnp.asarray(ret),
                                  jnp.asarray(MASK), clip_eps=None)
    ref_u = 0.5 * ((v - ret) ** 2 * MASK).sum() / MASK.sum()
    np.testing.assert_allclose(float(unclipped), ref_u, rtol=1e-5)


def test_entropy_and_schedule():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (B, T, V)).astype(np.float32)
    ent = np.asarray(ppo.entropy_from_logits(jnp.asarray(logits)))
    for i, t in [(0, 4), (1, 6), (2, 4)]:
        p = np.exp(logits[i, t] - logits[i, t].max())
        p /= p.sum()
        np.testing.assert_allclose(ent[i, t], -(p * np.log(p)).sum(), rtol=1e-5)
    bonus, _ = ppo.entropy_bonus(jnp.asarray(ent), jnp.asarray(MASK))
    np.testing.assert_allclose(float(bonus), (ent * MASK).sum() / MASK.sum(), rtol=1e-5)
    lin = ppo.entropy_coef_schedule(1e-2, 1e-3, 100, "linear")
    np.testing.assert_allclose([float(lin(s)) for s in (0, 50, 100, 200)],
                               [1e-2, 5.5e-3, 1e-3, 1e-3], rtol=1e-5)
    cos = ppo.entropy_coef_schedule(1e-2, 1e-3, 100, "cosine")
    np.testing.assert_allclose(float(cos(50)), 1e-3 + 0.5 * 9e-3, rtol=1e-5)
    assert float(ppo.entropy_coef_schedule(1e-2, kind="constant")(10**6)) == pytest.approx(1e-2)
    with pytest.raises(ValueError, match="entropy schedule kind 'step'"):
        ppo.entropy_coef_schedule(1e-2, 0.0, 10, "step")


def test_kl_estimators_match_numpy():
    logp, _, _ = _batch()
    ref = logp + np.random.default_rng(3).normal(0, 0.5, (B, T)).astype(np.float32)
    d = logp.astype(np.float64) - ref
    expected = {"k1": d, "k2": 0.5 * d**2, "k3": np.clip(np.exp(-d) + d - 1, 0, 10)}
    for kind, exp in expected.items():
        got = np.asarray(ppo.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), kind))
        np.testing.assert_allclose(got[MASK > 0], exp[MASK > 0], rtol=1e-4, atol=1e-6)
    loss, _ = ppo.kl_loss(jnp.asarray(logp), jnp.asarray(ref), jnp.asarray(MASK),
                          kind="low_var_kl", agg_mode="seq-mean-token-mean")
    np.testing.assert_allclose(float(loss), _np_aggregate(expected["k3"], MASK,
                                                          "seq-mean-token-mean"), rtol=1e-5)
    with pytest.raises(ValueError, match="kl estimator 'k4'"):
        ppo.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k4")


def test_actor_loss_combines_terms():
    logp, old, adv = _batch()
    ent = np.abs(logp)
    ref = logp - 0.1
    w = jnp.asarray([0.5, 2.0, 1.25, 0.25])
    args = (jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(MASK))
    total, metrics = ppo.actor_loss(*args, sample_weights_b=w, entropy_bt=jnp.asarray(ent),
                                    entropy_coef=0.01, ref_logprobs_bt=jnp.asarray(ref),
                                    kl_coef=0.1, kl_kind="k1")
    pg, _ = ppo.policy_loss(*args, sample_weights_b=w)
    expected = float(pg) - 0.01 * (ent * MASK).sum() / MASK.sum() + 0.1 * 0.1
    np.testing.assert_allclose(float(total), expected, rtol=1e-5)
    assert set(metrics) >= {"pg_loss", "entropy", "kl_loss", "actor_loss", "pg_clipfrac"}
    for pg_coef in (0.0, 0.5):  # the control without the reward scales the surrogate only
        total, metrics = ppo.actor_loss(*args, sample_weights_b=w, entropy_bt=jnp.asarray(ent),
                                        entropy_coef=0.01, pg_coef=pg_coef)
        expected = pg_coef * float(pg) - 0.01 * (ent * MASK).sum() / MASK.sum()
        np.testing.assert_allclose(float(total), expected, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(metrics["pg_loss"]), float(pg), rtol=1e-6)


# ---------------------------------------------------------------- aggregation and DAG weights


def test_aggregate_gradient_per_token_is_the_documented_weight():
    w = np.array([0.5, 2.0, 1.25, 0.25], np.float32)
    lens, n_tok, n_seq = MASK.sum(1), MASK.sum(), 3
    expected = {
        "token-mean": w[:, None] * MASK / n_tok,
        "seq-mean-token-mean": w[:, None] * MASK / np.maximum(lens, 1)[:, None] / n_seq,
        "seq-mean-token-sum": w[:, None] * MASK / n_seq,
    }
    for mode, exp in expected.items():
        g = jax.grad(ppo.aggregate)(jnp.zeros((B, T)), jnp.asarray(MASK), mode, jnp.asarray(w))
        np.testing.assert_allclose(np.asarray(g), exp, rtol=1e-6, err_msg=mode)


def _logits_loss(logits, tokens, old, adv, mask, mode, weights=None, normalizer=None):
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)[..., 0]
    loss, _ = ppo.policy_loss(logp, old, adv, mask, agg_mode=mode, sample_weights_b=weights,
                              normalizer=normalizer, dual_clip_c=3.0)
    return loss


# one trace per (shape, mode, weighted or not) instead of one per call
_grad_logits = jax.jit(jax.grad(_logits_loss), static_argnums=(5,))


def _grad_batch(seed=4):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(0, 1, (B, T, V)).astype(np.float32))
    tokens = jnp.asarray(rng.integers(0, V, (B, T)))
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1)[..., 0]
    old = logp + jnp.asarray(rng.normal(0, 0.2, (B, T)).astype(np.float32))
    adv = jnp.asarray(rng.normal(0, 1, (B, T)).astype(np.float32))
    return logits, tokens, old, adv


@pytest.mark.parametrize("mode", MODES)
def test_equal_durations_give_the_vanilla_gradient(mode):
    logits, tokens, old, adv = _grad_batch()
    mask = jnp.asarray(MASK)
    w = duration_weights(jnp.full((B,), 42.5))
    g_vanilla = _grad_logits(logits, tokens, old, adv, mask, mode)
    g_dag = _grad_logits(logits, tokens, old, adv, mask, mode, w)
    np.testing.assert_allclose(np.asarray(g_dag), np.asarray(g_vanilla), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_dag_gradient_is_weighted_sum_of_per_sample_gradients(mode):
    logits, tokens, old, adv = _grad_batch()
    mask = jnp.asarray(MASK)
    w = duration_weights(jnp.asarray([1.0, 10.0, 3.0, 6.0]))
    g_dag = np.asarray(_grad_logits(logits, tokens, old, adv, mask, mode, w))
    n_tok, n_seq = MASK.sum(), 3
    for i in range(B):
        # sample i alone, its own vanilla loss L_i (default normaliser of a one-row batch)
        row = slice(i, i + 1)
        g_i = np.asarray(_grad_logits(logits[row], tokens[row], old[row], adv[row],
                                                mask[row], mode))[0]
        coef = MASK[i].sum() / n_tok if mode == "token-mean" else 1.0 / n_seq
        np.testing.assert_allclose(g_dag[i], float(w[i]) * coef * g_i, rtol=1e-5, atol=1e-8)
    assert np.abs(g_dag[3]).max() == 0.0  # the empty row gets no gradient


def test_doubling_a_response_does_not_double_its_weight_in_seq_mean_modes():
    rng = np.random.default_rng(5)
    # row 0: two response tokens; row 0 doubled: the same two tokens repeated (four tokens).
    logp_s = rng.normal(-1, 0.3, (2, 2)).astype(np.float32)
    old_s = logp_s + rng.normal(0, 0.1, (2, 2)).astype(np.float32)
    adv_s = rng.normal(0, 1, (2, 2)).astype(np.float32)

    def build(double):
        out = []
        for x in (logp_s, old_s, adv_s):
            row0 = np.tile(x[0], 2) if double else np.pad(x[0], (0, 2))
            out.append(jnp.asarray(np.stack([row0, np.pad(x[1], (0, 2))])))
        mask = np.array([[1, 1, int(double), int(double)], [1, 1, 0, 0]], np.float32)
        return out + [jnp.asarray(mask)]

    for mode in ("seq-mean-token-mean", "seq-mean-token-sum", "token-mean"):
        grads = []
        for double in (False, True):
            logp, old, adv, mask = build(double)

            def f(w, logp=logp, old=old, adv=adv, mask=mask, mode=mode):
                return ppo.policy_loss(logp, old, adv, mask, agg_mode=mode, sample_weights_b=w)[0]

            # d loss / d w_0: how much sample 0 counts, per unit of its weight
            grads.append(float(jax.grad(f)(jnp.asarray([3.0, 1.0]))[0]))
        if mode == "seq-mean-token-mean":  # sample 0 counts the same, whatever its length
            np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5)
        elif mode == "seq-mean-token-sum":  # its token sum doubles; its coefficient stays w_0/S
            np.testing.assert_allclose(grads[1], 2 * grads[0], rtol=1e-5)
        else:  # token-mean: twice the tokens over N = 6 instead of 4, as without weights
            np.testing.assert_allclose(grads[1], 2 * grads[0] * 4 / 6, rtol=1e-5)


def test_micro_batches_sum_to_the_full_batch_loss():
    logp, old, adv = (jnp.asarray(x) for x in _batch())
    mask = jnp.asarray(MASK)
    w = jnp.asarray([0.5, 2.0, 1.25, 0.25])
    for mode in MODES:
        full, _ = ppo.policy_loss(logp, old, adv, mask, agg_mode=mode, sample_weights_b=w)
        norm = ppo.aggregation_normalizer(mask, mode)
        parts = [ppo.policy_loss(logp[s], old[s], adv[s], mask[s], agg_mode=mode,
                                 sample_weights_b=w[s], normalizer=norm)[0]
                 for s in (slice(0, 1), slice(1, 3), slice(3, 4))]
        np.testing.assert_allclose(float(sum(parts)), float(full), rtol=1e-5, err_msg=mode)


def test_bad_inputs_name_the_tensor():
    logp, old, adv = (jnp.asarray(x) for x in _batch())
    mask = jnp.asarray(MASK)
    with pytest.raises(AssertionError, match="old_logprobs_bt must match logprobs_bt"):
        ppo.policy_loss(logp, old[:, :-1], adv, mask)
    with pytest.raises(AssertionError, match="logprobs_bt must be"):
        ppo.policy_loss(logp[0], old[0], adv[0], mask[0])
    with pytest.raises(AssertionError, match="sample_weights_b must be"):
        ppo.policy_loss(logp, old, adv, mask, sample_weights_b=jnp.ones(3))
    with pytest.raises(ValueError, match="agg_mode 'seq-mean' is not one of"):
        ppo.policy_loss(logp, old, adv, mask, agg_mode="seq-mean")
    with pytest.raises(AssertionError, match="returns_bt must match values_bt"):
        ppo.value_loss(logp, old, adv[:2], mask)
