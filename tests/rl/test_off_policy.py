"""Off-policy correction (rl.off_policy): behaviour weights and both corrected objectives
against NumPy loops, equality with plain PPO when every sample is fresh, the learner's step in
each mode on the tiny model, and the config errors."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl import off_policy, ppo
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.learner_config import OFF_POLICY_MODES, LearnerConfig
from tests.rl.test_learner import FULL, ONE_DEVICE, TINY, _assert_close, _batch

# Left-padded prompt (2), response region 4 (right padded); rows 0-1 fresh, 2-3 stale.
MASK = np.array([
    [0, 0, 1, 1, 1, 1],
    [0, 0, 1, 1, 0, 0],
    [0, 0, 1, 1, 1, 1],
    [0, 0, 1, 1, 1, 0],
], np.float32)
B, T = MASK.shape
EPS, DUAL_C = 0.2, 3.0


def _inputs(seed=0, stale=True):
    """(logp of π_θ, behaviour, proximal, advantages); π_θ a little past π_prox."""
    rng = np.random.default_rng(seed)
    prox = np.log(rng.uniform(0.05, 0.9, (B, T))).astype(np.float32)
    behav = prox.copy()
    if stale:
        behav[2:] = prox[2:] + rng.normal(0, 0.6, (2, T)).astype(np.float32)
        behav[2, 2] = prox[2, 2] - 1.5  # w = e^1.5 ≈ 4.5 > C
        behav[3, 3] = prox[3, 3] + 1.0  # w = e^-1 ≈ 0.37
    logp = (prox + rng.normal(0, 0.1, (B, T))).astype(np.float32)
    logp[1, 2] = prox[1, 2] + 0.5  # r_p ≈ 1.65: outside the clip range
    adv = rng.normal(0, 1, (B, T)).astype(np.float32)
    pad = MASK == 0  # garbage outside the mask must not leak into anything
    logp[pad], behav[pad], prox[pad], adv[pad] = 30.0, -30.0, 5.0, 1e3
    return logp, behav, prox, adv


# ----------------------------------------------------------------------- NumPy references
def _np_weights(prox, behav, mask, mode, cap):
    """Raw w = π_prox/π_behav, the applied weight, and the three metrics, token by token."""
    raw, applied = np.zeros((B, T)), np.zeros((B, T))
    ws, above = [], []
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            w = math.exp(min(max(float(prox[i, t]) - float(behav[i, t]), -20.0), 20.0))
            over = cap is not None and w > cap
            raw[i, t] = w
            applied[i, t] = {"none": 1.0, "decoupled": 0.0 if over else w,
                             "tis": min(w, cap if cap is not None else math.inf)}[mode]
            ws.append(w)
            above.append(over)
    return raw, applied, {"behaviour_weight_mean": np.mean(ws),
                          "behaviour_weight_max": np.max(ws),
                          "behaviour_weight_clipped_frac": np.mean(above)}


def _np_surrogate(logp, ref, a):
    """PPO's ℓ(r) with r = π_θ/π_ref, ε = 0.2, dual clip c = 3."""
    r = math.exp(min(max(logp - ref, -20.0), 20.0))
    ell = max(-a * r, -a * min(max(r, 1 - EPS), 1 + EPS))
    return min(ell, -a * DUAL_C) if a < 0 else ell


def _np_token_losses(logp, behav, prox, adv, mask, mode, cap):
    """ℓ_t of the mode's objective (the table in rl.off_policy), token by token."""
    _, applied, _ = _np_weights(prox, behav, mask, mode, cap)
    out = np.zeros((B, T))
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            if mode == "none":
                out[i, t] = _np_surrogate(logp[i, t], behav[i, t], adv[i, t])
            else:
                out[i, t] = applied[i, t] * _np_surrogate(logp[i, t], prox[i, t], adv[i, t])
    return out


# ----------------------------------------------------------------------------- functions
def _loss(logp, behav, prox, adv, mask, mode, cap, **kw):
    """The learner's use of rl.ppo + rl.off_policy (ratio against π_prox when correcting)."""
    weights, _ = off_policy.behaviour_weights(prox, behav, jnp.asarray(MASK), mode, cap)
    corrected = mode != "none"
    return ppo.policy_loss(logp, prox if corrected else behav, adv, mask, clip_eps=EPS,
                           dual_clip_c=DUAL_C, token_weights_bt=weights if corrected else None,
                           **kw)[0]


CASES = [("none", 2.0), ("decoupled", 2.0), ("decoupled", None), ("tis", 2.0), ("tis", 1.0)]


@pytest.mark.parametrize("mode,cap", CASES)
def test_behaviour_weights_match_numpy(mode, cap):
    logp, behav, prox, adv = _inputs()
    got, metrics = off_policy.behaviour_weights(jnp.asarray(prox), jnp.asarray(behav),
                                                jnp.asarray(MASK), mode, cap)
    _, applied, ref_metrics = _np_weights(prox, behav, MASK, mode, cap)
    np.testing.assert_allclose(np.asarray(got), applied, rtol=1e-5)
    for k, v in ref_metrics.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, err_msg=k)
    if cap == 2.0:  # the e^1.5 token is over the cap, and it is the only one
        assert ref_metrics["behaviour_weight_clipped_frac"] == pytest.approx(1 / MASK.sum())


@pytest.mark.parametrize("mode,cap", CASES)
def test_token_losses_match_numpy(mode, cap):
    """ℓ_t token by token (a one-hot mask with normaliser 1 isolates it), then aggregated."""
    logp, behav, prox, adv = map(jnp.asarray, _inputs())
    ref = _np_token_losses(*map(np.asarray, (logp, behav, prox, adv)), MASK, mode, cap)
    onehots = np.zeros((B * T, B, T), np.float32)
    onehots[np.arange(B * T), np.arange(B * T) // T, np.arange(B * T) % T] = 1.0
    per_token = jax.vmap(lambda m: _loss(logp, behav, prox, adv, m, mode, cap,
                                         normalizer=1.0))(jnp.asarray(onehots))
    np.testing.assert_allclose(np.asarray(per_token).reshape(B, T) * MASK, ref, rtol=1e-5,
                               atol=1e-6)
    for agg in ppo.AGG_MODES:
        total = _loss(logp, behav, prox, adv, jnp.asarray(MASK), mode, cap, agg_mode=agg)
        want = float(ppo.aggregate(jnp.asarray(ref, jnp.float32), jnp.asarray(MASK), agg))
        np.testing.assert_allclose(float(total), want, rtol=1e-5, err_msg=agg)


@pytest.mark.parametrize("mode,cap", CASES)
def test_gradient_at_the_proximal_params_is_the_importance_weighted_one(mode, cap):
    """At θ = θ_prox (a single-pass step) the corrected modes give −w̄·A·∇log π per token,
    no gradient through w; plain PPO clips the stale tokens whose ratio w left the range."""
    _, behav, prox, adv = map(jnp.asarray, _inputs())
    grad = jax.grad(_loss)(prox, behav, jax.lax.stop_gradient(prox), adv, jnp.asarray(MASK),
                           mode, cap)
    raw, applied, _ = _np_weights(*map(np.asarray, (prox, behav)), MASK, mode, cap)
    a = np.asarray(adv)
    if mode == "none":  # r_b = w: live only inside the clip range (and under the dual clip)
        live = np.where(a > 0, raw < 1 + EPS, raw > 1 - EPS) & ~((a < 0) & (raw > DUAL_C))
        want = -a * raw * live
    else:
        want = -a * applied
    np.testing.assert_allclose(np.asarray(grad), want * MASK / MASK.sum(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode,cap", CASES[1:])
def test_corrected_modes_equal_ppo_when_every_sample_is_fresh(mode, cap):
    """π_behav = π_prox (staleness 0), π_θ elsewhere (a later update): same loss and gradient."""
    logp, _, prox, adv = map(jnp.asarray, _inputs(stale=False))
    args = (prox, prox, adv, jnp.asarray(MASK))
    for agg in ppo.AGG_MODES:
        want, g_want = jax.value_and_grad(_loss)(logp, *args, "none", cap, agg_mode=agg)
        got, g_got = jax.value_and_grad(_loss)(logp, *args, mode, cap, agg_mode=agg)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(g_got), np.asarray(g_want), rtol=1e-6, atol=1e-9)


def test_bad_mode_and_shape_name_the_problem():
    x = jnp.zeros((B, T))
    with pytest.raises(ValueError, match="off_policy mode 'vtrace' is not one of"):
        off_policy.behaviour_weights(x, x, x, "vtrace", 2.0)
    with pytest.raises(ValueError, match="off_policy='tis' needs a cap"):
        off_policy.behaviour_weights(x, x, x, "tis", None)
    with pytest.raises(AssertionError, match="token_weights_bt must match logprobs_bt"):
        ppo.policy_loss(x, x, x, x, token_weights_bt=jnp.ones((B, T - 1)))


# ------------------------------------------------------------------------------- learner
SINGLE = LearnerConfig(actor_lr=1e-3, critic_lr=2e-3, adam_eps=1e-6, duration_weighting="off")


@pytest.fixture(scope="module")
def params():
    return models.init_params(TINY, jax.random.PRNGKey(0))


def _learner(config, params, mesh_kwargs=ONE_DEVICE):
    learner = make_learner(TINY, config, shd.make_mesh(**mesh_kwargs))
    return learner, learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))


def _batch_for(learner, state, *, stale: bool, prox_in_batch: bool = False):
    """The test batch with behaviour log-probs = the learner's at the state's params (fresh),
    except rows 4-7 when stale: an older policy's (w from e^-0.6 to e^0.6, one token e^1.2)."""
    batch = _batch()
    prox = np.asarray(learner.compute_logprobs(state.policy_params, batch["tokens"],
                                               batch["attention_mask"]))
    batch["old_logprobs"] = prox.copy()
    if stale:
        shift = np.random.default_rng(7).uniform(-0.6, 0.6, prox.shape).astype(np.float32)
        shift[5, 7] = -1.2
        batch["old_logprobs"][4:] += shift[4:]
    if prox_in_batch:
        batch["prox_logprobs"] = prox
    if "values_old" not in learner.required_keys():
        del batch["values_old"]
    return batch, prox


def _run(config, params, *, stale=True, prox_in_batch=False, mesh_kwargs=ONE_DEVICE):
    """One train step on the test batch; returns (state, metrics, π_prox, batch)."""
    learner, state = _learner(config, params, mesh_kwargs)
    batch, prox = _batch_for(learner, state, stale=stale, prox_in_batch=prox_in_batch)
    state, metrics = learner.train_step(state, batch)
    return jax.device_get(state), jax.device_get(metrics), prox, batch


@pytest.mark.parametrize("mode", ["decoupled", "tis"])
@pytest.mark.parametrize("base", [SINGLE, FULL], ids=["single_pass", "several_updates"])
def test_train_step_equals_ppo_when_every_sample_is_fresh(params, base, mode):
    state_0, m_0, _, _ = _run(base, params, stale=False)
    state_1, m_1, _, _ = _run(dataclasses.replace(base, off_policy=mode), params, stale=False)
    _assert_close(state_1, state_0)
    shared = set(m_0) & set(m_1)
    assert {"pg_loss", "grad_norm_actor"} <= shared
    _assert_close({k: m_1[k] for k in shared}, {k: m_0[k] for k in shared}, atol=1e-5)
    np.testing.assert_allclose(m_1["behaviour_weight_mean"], 1.0, atol=1e-5)
    np.testing.assert_allclose(m_1["behaviour_weight_max"], 1.0, atol=1e-5)
    assert m_1["behaviour_weight_clipped_frac"] == 0


@pytest.mark.parametrize("mode", OFF_POLICY_MODES)
def test_train_step_with_stale_rows_reports_the_numpy_weights(params, mode):
    cfg = dataclasses.replace(SINGLE, off_policy=mode)
    state, metrics, prox, batch = _run(cfg, params)
    mask = (batch["response_mask"] * batch["attention_mask"]).astype(np.float32)
    w = np.exp(prox - batch["old_logprobs"])[mask > 0]
    np.testing.assert_allclose(metrics["behaviour_weight_mean"], w.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["behaviour_weight_max"], w.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["behaviour_weight_clipped_frac"], np.mean(w > 2.0))
    assert np.isfinite(metrics["loss"]) and w.max() > 3.0 > 2.0  # the e^1.2 token
    if mode != "none":  # the ratio is against π_prox = this forward: 1 everywhere
        np.testing.assert_allclose([metrics["ratio_min"], metrics["ratio_max"]], 1.0, atol=1e-6)


def test_modes_differ_on_stale_rows(params):
    states = {m: _run(dataclasses.replace(SINGLE, off_policy=m), params)[0]
              for m in OFF_POLICY_MODES}
    for a, b in (("none", "decoupled"), ("none", "tis"), ("decoupled", "tis")):
        diff = jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))),
                            states[a].policy_params, states[b].policy_params)
        assert max(jax.tree.leaves(diff)) > 1e-6, (a, b)


@pytest.mark.parametrize("mode", ["decoupled", "tis"])
def test_proximal_logprobs_in_the_step_equal_given_ones(params, mode):
    """Several updates: π_prox from the step's own extra forward == batch['prox_logprobs']."""
    cfg = dataclasses.replace(FULL, off_policy=mode)
    state_in, m_in, _, _ = _run(cfg, params)
    state_given, m_given, _, _ = _run(cfg, params, prox_in_batch=True)
    _assert_close(state_in, state_given)
    _assert_close(m_in, m_given, atol=1e-5)
    assert m_in["behaviour_weight_max"] > 3.0


def test_single_pass_equals_separate_proximal_pass(params):
    """One update either way: π_prox (and values_old) from the step's forward, or from the
    extra forward of a micro-batched step whose one micro-batch is the whole batch."""
    cfg = dataclasses.replace(SINGLE, off_policy="tis")
    state_1, m_1, _, _ = _run(cfg, params)
    learner, state = _learner(dataclasses.replace(cfg, micro_batch_size=8), params)
    batch, _ = _batch_for(learner, state, stale=True)
    out = learner.compute_logprobs_and_values(state.policy_params, state.critic_params,
                                              batch["tokens"], batch["attention_mask"])
    batch["values_old"] = np.asarray(out["values"])
    state_2, m_2 = jax.device_get(learner.train_step(state, batch))
    _assert_close(state_2, state_1)
    for k in ("behaviour_weight_mean", "behaviour_weight_max", "behaviour_weight_clipped_frac",
              "pg_loss", "vf_loss"):
        np.testing.assert_allclose(m_2[k], m_1[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_corrected_step_on_8_devices_equals_1_device(params):
    cfg = dataclasses.replace(FULL, off_policy="decoupled")
    state_1, m_1, _, _ = _run(cfg, params)
    state_8, m_8, _, _ = _run(cfg, params, mesh_kwargs=dict(data=2, fsdp=4))
    _assert_close(state_8, state_1)
    _assert_close(m_8, m_1, rtol=1e-4, atol=1e-5)


def test_off_policy_config_errors():
    with pytest.raises(ValueError, match=r"LearnerConfig.off_policy='vtrace' is not one of "
                                         r"\('none', 'decoupled', 'tis'\)"):
        LearnerConfig(off_policy="vtrace")
    with pytest.raises(ValueError, match=r"off_policy_cap must be None or >= 1 \(a fresh "
                                         r"token's behaviour weight is 1\), got 0.5"):
        LearnerConfig(off_policy="tis", off_policy_cap=0.5)
    with pytest.raises(ValueError, match="off_policy='tis' truncates the behaviour weight at "
                                         "off_policy_cap; set it"):
        LearnerConfig(off_policy="tis", off_policy_cap=None)
    uncapped = LearnerConfig(off_policy="decoupled", off_policy_cap=None)
    assert LearnerConfig.from_dict(uncapped.to_dict()) == uncapped
    assert LearnerConfig().off_policy == "none" and LearnerConfig().off_policy_cap == 2.0


def test_inverse_inclusion_weights_reach_the_train_step(params):
    """learner.duration_weighting='inverse_inclusion' with batch['inclusion'] from the loop's
    ArrivalModel: constant inclusion is the unweighted step; inclusion ∝ 1/Δt is batch_mean."""
    learner, state = _learner(SINGLE, params)
    batch, _ = _batch_for(learner, state, stale=False)
    dt = np.linspace(1.0, 20.0, len(batch["tokens"])).astype(np.float32)
    batch["dt_s"] = dt

    def step(config, extra):
        lr, st0 = _learner(config, params)
        b = {**batch, **extra}
        return jax.device_get(lr.train_step(st0, b)[0])

    off = step(SINGLE, {})
    inv = dataclasses.replace(SINGLE, duration_weighting="inverse_inclusion")
    _assert_close(step(inv, {"inclusion": np.full_like(dt, 0.4)}), off)
    mean = step(dataclasses.replace(SINGLE, duration_weighting="batch_mean"), {})
    _assert_close(step(inv, {"inclusion": (dt.min() / dt).astype(np.float32)}), mean)
    with pytest.raises(KeyError, match="inclusion"):  # named before any work
        step(inv, {})
