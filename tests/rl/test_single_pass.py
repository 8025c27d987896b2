"""Cheaper train steps, same update: a batch padded to its length bucket equals the one padded
to the configured maxima, and the single-pass step (values_old from its own forward) equals
the two-pass step (values_old from a separate forward)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl.batch import old_values_in_step, required_batch_keys
from rl4mle_jax.rl.learner import make_learner
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.rollout.collate import build_batch

TINY = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)
ONE_DEVICE = dict(devices=jax.devices()[:1])
# The default learner (separate critic, GAE, 1 epoch, 1 minibatch) with the loop's rates.
DEFAULT = LearnerConfig(actor_lr=3e-5, critic_lr=1e-4, temperature=0.7, adam_eps=1e-6)
SEVERAL = dataclasses.replace(DEFAULT, ppo_epochs=2, num_minibatches=2, kl_mode="reward",
                              kl_coef=0.05, entropy_coef=0.01)
MAX_PROMPT, MAX_RESPONSE, BUCKET = 24, 32, 8


def _experiences(b=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(b):
        n_p, n_r = int(rng.integers(3, 13)), int(rng.integers(0 if i == 2 else 1, 14))
        out.append(types.SimpleNamespace(
            episode_id=i, prompt_ids=rng.integers(1, 64, n_p).tolist(),
            response_ids=rng.integers(1, 64, n_r).tolist(),
            logprobs=rng.normal(-4.2, 0.2, n_r).tolist(), reward=float(rng.normal()),
            started_at=0.0, finished_at=float(rng.uniform(0.5, 20.0)), duration_s=1.0))
    return out


@pytest.fixture(scope="module")
def params():
    return models.init_params(TINY, jax.random.PRNGKey(0))


def _step(config, params, batch, two_pass: bool):
    """One train step; two_pass: values_old (and the gap) from a separate forward first."""
    learner = make_learner(TINY, config, shd.make_mesh(**ONE_DEVICE))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    batch = dict(batch)
    if config.uses_ref:
        batch["ref_logprobs"] = np.asarray(learner.compute_logprobs(
            state.policy_params, batch["tokens"], batch["attention_mask"])) - 0.01
    if two_pass:
        out = learner.compute_logprobs_and_values(state.policy_params, state.critic_params,
                                                  batch["tokens"], batch["attention_mask"])
        batch["values_old"] = np.asarray(out["values"])
        gap = np.abs(np.asarray(out["logprobs"]) - batch["old_logprobs"]) * batch["response_mask"]
    state, metrics = learner.train_step(state, batch)
    metrics = jax.device_get(metrics)
    if two_pass and "behaviour_logp_gap_max" in metrics:
        np.testing.assert_allclose(metrics["behaviour_logp_gap_max"], gap.max(), rtol=1e-5)
    return jax.device_get(state), metrics


def _assert_metrics_close(a, b, rtol=1e-5, atol=1e-5):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


def _assert_params_close(a, b, atol=1e-6):
    for (path, x), (_, y) in zip(jax.tree_util.tree_leaves_with_path(a),
                                 jax.tree_util.tree_leaves_with_path(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_default_config_needs_no_values_old():
    assert old_values_in_step(DEFAULT) and "values_old" not in required_batch_keys(DEFAULT)
    assert not old_values_in_step(SEVERAL) and "values_old" in required_batch_keys(SEVERAL)
    assert not old_values_in_step(dataclasses.replace(DEFAULT, micro_batch_size=2))


@pytest.mark.parametrize("config", [DEFAULT, SEVERAL], ids=["default", "several_updates"])
def test_bucket_padding_equals_max_padding(params, config):
    exps = _experiences()
    bucketed = build_batch(exps, MAX_PROMPT, MAX_RESPONSE, 0, length_bucket=BUCKET)
    padded = build_batch(exps, MAX_PROMPT, MAX_RESPONSE, 0)
    assert bucketed["tokens"].shape == (8, 16 + 16) and padded["tokens"].shape == (8, 56)
    two_pass = not old_values_in_step(config)
    state_b, m_b = _step(config, params, bucketed, two_pass)
    state_p, m_p = _step(config, params, padded, two_pass)
    _assert_metrics_close(m_b, m_p)
    _assert_params_close(state_b.policy_params, state_p.policy_params)
    _assert_params_close(state_b.critic_params, state_p.critic_params)


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_single_pass_equals_separate_old_values_pass(params, critic):
    """Default shape (1 epoch, 1 minibatch): values_old inside the step == a separate pass."""
    config = dataclasses.replace(DEFAULT, critic=critic)
    batch = build_batch(_experiences(seed=1), MAX_PROMPT, MAX_RESPONSE, 0, length_bucket=BUCKET)
    state_1, m_1 = _step(config, params, batch, two_pass=False)
    state_2, m_2 = _step(config, params, batch, two_pass=True)
    _assert_metrics_close(m_1, m_2)
    assert m_1["vf_loss"] > 0 and m_1["behaviour_logp_gap_max"] > 0
    _assert_params_close(state_1.policy_params, state_2.policy_params)
    _assert_params_close(state_1.critic_params, state_2.critic_params)


def test_gap_metric_counts_only_fresh_rows(params):
    batch = build_batch(_experiences(seed=2), MAX_PROMPT, MAX_RESPONSE, 0, length_bucket=BUCKET)
    _, m_all = _step(DEFAULT, params, batch, two_pass=False)
    batch["fresh"] = np.zeros(8, np.float32)
    _, m_none = _step(DEFAULT, params, batch, two_pass=False)
    assert m_all["behaviour_logp_gap_max"] > 0 and m_none["behaviour_logp_gap_max"] == 0
    assert m_none["loss"] == pytest.approx(m_all["loss"], rel=1e-6)


def test_several_updates_without_values_old_name_the_problem(params):
    config = dataclasses.replace(SEVERAL, kl_mode="none")
    learner = make_learner(TINY, config, shd.make_mesh(**ONE_DEVICE))
    batch = build_batch(_experiences(), MAX_PROMPT, MAX_RESPONSE, 0)
    with pytest.raises(KeyError, match=r"missing \['values_old'\]"):
        learner.train_step(None, batch)
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    batch = learner.prepare_batch({**batch, "values_old": np.zeros_like(batch["old_logprobs"])})
    del batch["values_old"]
    with pytest.raises(ValueError, match="only a single-pass step"):
        learner.train_step_jit(state, batch)
