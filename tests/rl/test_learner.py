"""The PPO learner on the tiny Qwen2 model: sharding invariance, exact micro-batching,
variants (shared critic, group baselines), input errors, and PPO raising a token reward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax import models
from rl4mle_jax import sharding as shd
from rl4mle_jax.engine import backend_compiles
from rl4mle_jax.rl.learner import (
    entropy_agrees,
    logits_start,
    make_learner,
    shift_right,
    token_logprobs_and_entropy,
)
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.sampling import Sampler

TINY = models.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8)
ONE_DEVICE = dict(devices=jax.devices()[:1])
# Every term switched on. adam_eps 1e-6: parameters whose exact gradient is 0 (e.g. key
# biases, which softmax cancels) get float-noise gradients whose sign differs between device
# layouts, and Adam's 1/sqrt(v) would blow that noise up to ±lr with a tiny eps.
FULL = LearnerConfig(actor_lr=1e-3, critic_lr=2e-3, adam_eps=1e-6, ppo_epochs=2,
                     num_minibatches=2, kl_mode="loss", kl_coef=0.1, entropy_coef=0.01,
                     entropy_decay_steps=10, weight_decay=0.01, warmup_steps=1, total_steps=8,
                     lr_schedule="cosine", duration_weighting="batch_mean")


def _batch(b=8, t=12, seed=0, params=None):
    """A batch with left-padded prompts, ragged responses and one row without response."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, TINY.vocab_size, (b, t)).astype(np.int32)
    attention = np.ones((b, t), np.int32)
    attention[: b // 2, :2] = 0  # left padding
    response = np.zeros((b, t), np.int32)
    response[:, 6:] = 1
    response[1, 9:] = 0  # shorter response
    attention[1, 9:] = 0  # right padding after it
    response[2] = 0  # no response tokens at all
    out = dict(tokens=tokens, attention_mask=attention, response_mask=response,
               rewards=rng.normal(size=b).astype(np.float32),
               dt_s=rng.uniform(0.5, 20.0, b).astype(np.float32),
               old_logprobs=rng.normal(-4.2, 0.2, (b, t)).astype(np.float32),
               ref_logprobs=rng.normal(-4.2, 0.2, (b, t)).astype(np.float32),
               values_old=rng.normal(0.0, 0.3, (b, t)).astype(np.float32))
    return out


@pytest.fixture(scope="module")
def params():
    return models.init_params(TINY, jax.random.PRNGKey(0))


def _one_step(config, mesh_kwargs, params, batch):
    learner = make_learner(TINY, config, shd.make_mesh(**mesh_kwargs))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    state, metrics = learner.train_step(state, batch)
    return jax.device_get(state), jax.device_get(metrics)


def _assert_close(a, b, rtol=1e-4, atol=2e-5):
    leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
    assert tree_a == tree_b
    for (path, x), (_, y) in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.fixture(scope="module")
def reference(params):
    """One train_step (2 epochs × 2 minibatches = 4 updates) on a single device."""
    return _one_step(FULL, ONE_DEVICE, params, _batch())


def test_token_logprobs_and_entropy_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 5))
    logp, ent = jax.device_get(token_logprobs_and_entropy(jnp.asarray(logits), jnp.asarray(tokens)))
    z = logits - logits.max(-1, keepdims=True)
    ref_logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    for b in range(2):
        assert logp[b, 0] == 0 and ent[b, 0] == 0
        for t in range(1, 5):
            np.testing.assert_allclose(logp[b, t], ref_logp[b, t - 1, tokens[b, t]], rtol=1e-5)
            p = np.exp(ref_logp[b, t - 1])
            np.testing.assert_allclose(ent[b, t], -(p * ref_logp[b, t - 1]).sum(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(shift_right(jnp.arange(6.0).reshape(2, 3))),
                                  [[0, 0, 1], [0, 3, 4]])


def test_entropy_gate_keeps_the_value_and_the_gradient_of_confident_positions():
    """learner.entropy_gate: the entropy's value is unchanged; its gradient (NumPy:
    dH/dz_j = -p_j (log p_j + H)) reaches the positions whose top token has probability >= the
    gate and no other; the log-probs and their gradient are untouched."""
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 6, 5)).astype(np.float32)
    logits[0, 1, 3] += 6.0  # two confident positions (top probability ~0.94 and ~0.99)
    logits[1, 3, 0] += 8.0
    tokens = rng.integers(0, 5, (2, 6))
    x, tok = jnp.asarray(logits), jnp.asarray(tokens)
    gate = 0.9
    full = jax.device_get(token_logprobs_and_entropy(x, tok))
    gated = jax.device_get(token_logprobs_and_entropy(x, tok, entropy_gate=gate))
    for a, b in zip(full, gated):
        np.testing.assert_array_equal(a, b)
    grad = np.asarray(jax.grad(lambda z: jnp.sum(
        token_logprobs_and_entropy(z, tok, entropy_gate=gate)[1]))(x))
    z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p = np.exp(logp)
    h = -(p * logp).sum(-1, keepdims=True)
    ref = -p * (logp + h)
    confident = p.max(-1) >= gate
    confident[:, -1] = False  # the last position predicts nothing
    assert confident.sum() == 2
    np.testing.assert_allclose(grad, np.where(confident[..., None], ref, 0.0), atol=1e-6)
    g_logp = [np.asarray(jax.grad(lambda z, e=e: jnp.sum(token_logprobs_and_entropy(
        z, tok, entropy_gate=e)[0]))(x)) for e in (0.0, gate)]
    np.testing.assert_array_equal(*g_logp)
    with pytest.raises(ValueError, match=r"entropy_gate must be in \[0, 1\)"):
        LearnerConfig(entropy_gate=1.0)


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.1), (0, 1.0, 0.6), (4, 1.0, 0.0),
                                               (0, 0.7, 0.0), (5, 0.9, 0.2)])
def test_truncated_token_logprobs_match_numpy(top_k, top_p, min_p):
    """The sampler's truncation in the learner: each token's log-prob and entropy are those of
    the truncated distribution over the kept set plus the token itself (NumPy), and the
    gradients are finite although cut tokens hold -inf."""
    from tests.test_sampling import _np_sampling_logprobs

    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(3, 9, 11)) * 2.5).astype(np.float32)
    tokens = rng.integers(0, 11, (3, 9))
    kw = dict(top_k=top_k, top_p=top_p, min_p=min_p)
    logp, ent = jax.device_get(token_logprobs_and_entropy(jnp.asarray(logits),
                                                          jnp.asarray(tokens), **kw))
    outside = 0
    for b in range(3):
        for t in range(1, 9):
            tok = tokens[b, t]
            ref = _np_sampling_logprobs(logits[b, t - 1], 1.0, top_k, top_p, min_p)
            keep = np.isfinite(ref)
            outside += not keep[tok]
            keep[tok] = True  # the token a row holds is always in the set
            z = np.where(keep, logits[b, t - 1].astype(np.float64), -np.inf)
            lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            np.testing.assert_allclose(logp[b, t], lp[tok], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(ent[b, t], -(np.exp(lp[keep]) * lp[keep]).sum(),
                                       rtol=1e-5, atol=1e-6)
    assert outside > 0  # random tokens: some lie outside the set, and are kept
    grad = jax.grad(lambda x: sum(jnp.sum(v) for v in token_logprobs_and_entropy(
        x, jnp.asarray(tokens), **kw)))(jnp.asarray(logits))
    assert np.isfinite(np.asarray(grad)).all()


@pytest.mark.parametrize("mesh_kwargs", [dict(data=1, fsdp=2, tensor=4),
                                         dict(data=2, fsdp=4, tensor=1)])
def test_train_step_on_8_devices_equals_1_device(reference, params, mesh_kwargs):
    state_1, metrics_1 = reference
    state_8, metrics_8 = _one_step(FULL, mesh_kwargs, params, _batch())
    assert int(state_8.step) == 1
    _assert_close(state_8, state_1)
    _assert_close(metrics_8, metrics_1, rtol=1e-4, atol=1e-5)
    # The update did something: params moved and the loss terms are live.
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), state_1.policy_params, params)
    assert min(jax.tree.leaves(moved)) > 0
    assert metrics_1["kl_loss"] != 0 and metrics_1["entropy"] > 0 and metrics_1["vf_loss"] > 0


def test_micro_batches_equal_full_minibatch(reference, params):
    """4 micro-batches of 1 row per minibatch of 4: the same update (normalised by the minibatch
    token count, duration weights from the whole batch)."""
    state_full, metrics_full = reference
    state_micro, metrics_micro = _one_step(dataclasses.replace(FULL, micro_batch_size=1),
                                           ONE_DEVICE, params, _batch())
    _assert_close(state_micro, state_full)
    for key in ("pg_loss", "vf_loss", "kl_loss", "entropy", "loss", "grad_norm_actor",
                "grad_norm_critic", "ratio_max", "ratio_min", "pg_clipfrac"):
        np.testing.assert_allclose(metrics_micro[key], metrics_full[key], rtol=1e-5, atol=1e-6)


def test_shared_trunk_critic_micro_batches_and_sequence_mean(params):
    """Shared trunk (the critic params are only the value head), seq-mean-token-sum
    aggregation, KL in the reward: micro-batches == full minibatch."""
    cfg = dataclasses.replace(FULL, critic="shared", agg_mode="seq-mean-token-sum",
                              kl_mode="reward", entropy_coef=0.0, num_minibatches=1)
    state_full, m_full = _one_step(cfg, ONE_DEVICE, params, _batch(seed=3))
    state_micro, m_micro = _one_step(dataclasses.replace(cfg, micro_batch_size=2), ONE_DEVICE,
                                     params, _batch(seed=3))
    assert set(state_full.critic_params) == {"value_head"}
    _assert_close(state_micro, state_full)
    np.testing.assert_allclose(m_micro["vf_loss"], m_full["vf_loss"], rtol=1e-5)


def test_group_baseline_without_critic_raises_logprob_of_better_samples(params):
    cfg = LearnerConfig(critic="none", advantage_estimator="grpo", group_size=4, actor_lr=3e-3,
                        duration_weighting="off", ppo_epochs=2)
    learner = make_learner(TINY, cfg, shd.make_mesh(fsdp=2, tensor=4))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    assert state.critic_params == {}
    batch = _batch(seed=5)
    del batch["values_old"], batch["dt_s"]  # not needed by this config
    batch["response_mask"][2, 6:] = 1  # every row has a response
    before = learner.compute_logprobs(state.policy_params, batch["tokens"],
                                      batch["attention_mask"])
    batch["old_logprobs"] = np.asarray(before)
    state, metrics = learner.train_step(state, batch)
    after = learner.compute_logprobs(state.policy_params, batch["tokens"], batch["attention_mask"])
    mask = batch["response_mask"] * batch["attention_mask"]
    delta_b = np.sum((np.asarray(after) - np.asarray(before)) * mask, axis=1)
    groups = batch["rewards"].reshape(2, 4)
    centred = (groups - groups.mean(1, keepdims=True)).reshape(-1)
    assert np.corrcoef(centred, delta_b)[0, 1] > 0.8, (centred, delta_b)
    assert "vf_loss" not in metrics


@pytest.mark.parametrize("coef,direction", [(-1.0, -1), (0.0, 0), (1.0, 1)],
                         ids=["minimise", "off", "bonus"])
def test_entropy_coefficient_sign_on_a_batch_without_signal(params, coef, direction):
    """Equal rewards give leave-one-out advantages of 0, so the entropy term is the policy's
    only gradient: a negative coefficient lowers the response tokens' entropy (the CPU
    default's sharpening, configs/task.py), a positive one raises it, 0 leaves the policy."""
    cfg = LearnerConfig(critic="none", advantage_estimator="rloo", group_size=0, actor_lr=3e-3,
                        duration_weighting="off", temperature=0.7, entropy_coef=coef)
    learner = make_learner(TINY, cfg, shd.make_mesh(**ONE_DEVICE))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    batch = _batch(seed=6)
    del batch["values_old"], batch["dt_s"]
    batch["rewards"][:] = -10.0  # every episode failed alike
    mask = batch["response_mask"] * batch["attention_mask"]

    def entropy(state):
        out = learner.compute_logprobs_and_values(state.policy_params, state.critic_params,
                                                  batch["tokens"], batch["attention_mask"])
        return float(np.sum(np.asarray(out["entropy"]) * mask) / mask.sum()), out

    before, out = entropy(state)
    batch["old_logprobs"] = np.asarray(out["logprobs"])
    for _ in range(3):
        state, metrics = learner.train_step(state, batch)
        assert float(metrics["entropy_coef"]) == pytest.approx(coef)
    after, _ = entropy(state)
    if direction == 0:
        assert after == pytest.approx(before, rel=1e-6)
    else:
        # random weights start near the maximum, log 64 = 4.16: the bonus can add little
        assert direction * (after - before) > 1e-3, (before, after)


def test_without_the_policy_gradient_only_the_entropy_term_trains(params):
    """learner.pg_coef=0 (the control of configs/sweep_control.py): a batch whose rewards
    differ moves the policy exactly as the same batch with equal rewards, i.e. by the entropy
    term alone, and not at all without it."""
    base = dict(critic="none", advantage_estimator="rloo", group_size=0, actor_lr=3e-3,
                duration_weighting="off", temperature=0.7)
    batch = _batch(seed=6)
    del batch["values_old"], batch["dt_s"]
    batch["rewards"] = np.where(np.arange(len(batch["rewards"])) % 2, 0.9, -10.0)
    flat = {**batch, "rewards": np.full_like(batch["rewards"], -10.0)}

    def trained(cfg, b):
        learner = make_learner(TINY, cfg, shd.make_mesh(**ONE_DEVICE))
        state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
        for _ in range(2):
            state, metrics = learner.train_step(state, b)
        return jax.tree.leaves(jax.device_get(state.policy_params)), metrics

    start = jax.tree.leaves(jax.device_get(params))
    still, metrics = trained(LearnerConfig(**base, pg_coef=0.0), batch)
    assert float(metrics["pg_loss"]) != 0.0  # the surrogate is there, weighted out
    for a, b in zip(start, still):
        np.testing.assert_array_equal(a, b)
    control, _ = trained(LearnerConfig(**base, pg_coef=0.0, entropy_coef=-1.0), batch)
    sharpen, _ = trained(LearnerConfig(**base, entropy_coef=-1.0), flat)
    rl, _ = trained(LearnerConfig(**base, entropy_coef=-1.0), batch)
    for a, b in zip(control, sharpen):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert any(not np.allclose(a, b, atol=1e-6) for a, b in zip(control, rl))
    # learner.entropy_gate in the train step: the random tiny model is nowhere 99% sure of a
    # token, so a gated entropy term has no gradient at all.
    gated, _ = trained(LearnerConfig(**base, pg_coef=0.0, entropy_coef=-1.0, entropy_gate=0.99),
                       batch)
    for a, b in zip(start, gated):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="pg_coef must be finite and >= 0"):
        LearnerConfig(pg_coef=-1.0)
    with pytest.raises(ValueError, match=r"entropy_disagree must be in \[-1, 0\]"):
        LearnerConfig(entropy_agree=True, entropy_disagree=1.0)
    with pytest.raises(ValueError, match="set entropy_agree=True with it"):
        LearnerConfig(entropy_disagree=-1.0)


def test_entropy_agree_truth_table_and_held_top_against_numpy():
    """learner.entropy_agree: sharpening (mass to the top token) agrees with the policy gradient
    where (advantage >= 0) == (the held token is the top one); `with_top` is NumPy's argmax."""
    adv = jnp.asarray([[1.0, 1.0, 0.0, -1.0, -1.0]])
    top = jnp.asarray([[True, False, True, True, False]])
    assert entropy_agrees(adv, top).tolist() == [[True, False, True, False, True]]
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 7, 6)).astype(np.float32)
    tokens = rng.integers(0, 6, (2, 7))
    tokens[0, 1:4] = logits[0, :3].argmax(-1)  # some held tokens are the top ones
    logp, ent, held_top = jax.device_get(token_logprobs_and_entropy(
        jnp.asarray(logits), jnp.asarray(tokens), with_top=True))
    ref = np.zeros((2, 7), bool)
    ref[:, 1:] = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    np.testing.assert_array_equal(held_top, ref)
    assert ref[0, 1:4].all() and not ref.all()
    plain = jax.device_get(token_logprobs_and_entropy(jnp.asarray(logits), jnp.asarray(tokens)))
    np.testing.assert_array_equal(logp, plain[0])
    np.testing.assert_array_equal(ent, plain[1])


def test_entropy_agree_leaves_out_the_rows_whose_policy_gradient_disagrees(params):
    """In the train step, with the policy gradient weighted out and every held token the
    policy's top one: rows 4-7 repeat rows 0-3, so the entropy term's gradient with every row
    is twice that of rows 0-3 alone. entropy_agree keeps rows 0-3 (advantage > 0) and leaves
    out their copies (advantage < 0): the gradient's norm halves. With equal rewards (every
    advantage 0) nothing is left out."""
    t, p = 12, 6
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, TINY.vocab_size, (4, t)).astype(np.int32)
    for i in range(p, t):  # greedy: each response token is the model's top one
        logits = np.asarray(models.qwen2.logits(TINY, params, jnp.asarray(tokens)))
        tokens[:, i] = logits[:, i - 1].argmax(-1)
    tokens = np.concatenate([tokens, tokens])
    response = np.zeros((8, t), np.int32)
    response[:, p:] = 1
    batch = dict(tokens=tokens, attention_mask=np.ones((8, t), np.int32),
                 response_mask=response, rewards=np.repeat([1.0, -1.0], 4).astype(np.float32),
                 old_logprobs=np.full((8, t), -1.0, np.float32))
    base = dict(critic="none", advantage_estimator="rloo", group_size=0, actor_lr=1e-3,
                duration_weighting="off", pg_coef=0.0, entropy_coef=-1.0)

    def grad_norm(b, **kw):
        learner = make_learner(TINY, LearnerConfig(**base, **kw), shd.make_mesh(**ONE_DEVICE))
        state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
        _, metrics = learner.train_step(state, b)
        return float(metrics["grad_norm_actor"]), float(metrics["entropy"])

    (every, h0), (agree, h1) = grad_norm(batch), grad_norm(batch, entropy_agree=True)
    assert every > 0 and h0 == pytest.approx(h1)
    assert agree == pytest.approx(every / 2, rel=1e-4)
    # entropy_disagree=w weighs the copies' gradient by w: (1 + w) x that of rows 0-3 alone;
    # reversed (w = -1), the copies cancel rows 0-3 and the value is still the entropy.
    for w in (-0.5, -1.0):
        norm, h = grad_norm(batch, entropy_agree=True, entropy_disagree=w)
        assert h == pytest.approx(h0)
        assert norm == pytest.approx(every * (1 + w) / 2, rel=1e-4, abs=1e-6 * every)
    flat = {**batch, "rewards": np.full(8, -1.0, np.float32)}
    assert grad_norm(flat, entropy_agree=True)[0] == pytest.approx(grad_norm(flat)[0], rel=1e-6)


def test_bad_batches_name_the_problem(params):
    learner = make_learner(TINY, FULL, shd.make_mesh(data=2, fsdp=4))
    state = None  # never reached: prepare_batch fails first
    batch = _batch()
    del batch["values_old"]
    with pytest.raises(KeyError, match=r"missing \['values_old'\]"):
        learner.train_step(state, batch)
    batch = _batch()
    batch["rewards"] = batch["rewards"][:, None]
    with pytest.raises(ValueError, match=r"batch\['rewards'\] has shape \(8, 1\), expected \(8,\)"):
        learner.train_step(state, batch)
    batch = _batch()
    batch["old_logprobs"] = batch["old_logprobs"][:, :-1]
    with pytest.raises(ValueError, match=r"batch\['old_logprobs'\] has shape \(8, 11\)"):
        learner.train_step(state, batch)
    with pytest.raises(ValueError, match="batch size 4 is not a multiple of the data×fsdp mesh"):
        learner.train_step(state, _batch(b=4))
    batch = _batch()
    batch["tokens"][3, 5] = 64
    with pytest.raises(ValueError, match=r"'tokens'\] has id 64 outside \[0, vocab_size=64\)"):
        learner.train_step(state, batch)
    batch = _batch()
    batch["rewards"][5] = np.nan
    with pytest.raises(ValueError, match=r"batch\['rewards'\] has non-finite values in rows \[5\]"):
        learner.train_step(state, batch)
    odd = make_learner(TINY, dataclasses.replace(FULL, micro_batch_size=3),
                       shd.make_mesh(**ONE_DEVICE))
    with pytest.raises(ValueError, match="minibatch size 4 is not a multiple of micro_batch_si"):
        odd.train_step(state, _batch())


def test_learner_config_errors():
    with pytest.raises(ValueError, match="advantage_estimator='gae' needs a critic"):
        LearnerConfig(critic="none")
    with pytest.raises(ValueError, match=r"LearnerConfig.kl_mode='both' is not one of"):
        LearnerConfig(kl_mode="both")
    with pytest.raises(KeyError, match=r"unknown learner config keys \['lr'\]"):
        LearnerConfig.from_dict({"lr": 1e-3})
    assert LearnerConfig.from_dict(FULL.to_dict()) == FULL


# ------------------------------------------------------------------------------ PPO learns
TARGET, STOP, PROMPT_LEN, NEW = 7, 1, 6, 8


def _rollout(sampler, learner, state, prompts, rng, **sampling):
    """Sample with the project's Sampler and build a learner batch (prompt left padded)."""
    out = sampler.generate(state.policy_params, prompts, rng, max_new_tokens=NEW, **sampling)
    b = len(prompts)
    tokens = np.zeros((b, PROMPT_LEN + NEW), np.int32)
    attention = np.zeros_like(tokens)
    response = np.zeros_like(tokens)
    old_logprobs = np.zeros((b, PROMPT_LEN + NEW), np.float32)
    for i, p in enumerate(prompts):
        tokens[i, PROMPT_LEN - len(p):PROMPT_LEN] = p
        attention[i, PROMPT_LEN - len(p):PROMPT_LEN] = 1
        n = out.lengths[i]
        tokens[i, PROMPT_LEN:PROMPT_LEN + n] = out.tokens[i, :n]
        attention[i, PROMPT_LEN:PROMPT_LEN + n] = 1
        response[i, PROMPT_LEN:PROMPT_LEN + n] = 1
        old_logprobs[i, PROMPT_LEN:PROMPT_LEN + n] = out.logprobs[i, :n]
    rewards = np.array([np.sum(out.tokens[i, :out.lengths[i]] == TARGET) / NEW
                        for i in range(b)], np.float32)
    lv = learner.compute_logprobs_and_values(state.policy_params, state.critic_params, tokens,
                                             attention)
    return dict(tokens=tokens, attention_mask=attention, response_mask=response,
                old_logprobs=old_logprobs, rewards=rewards,
                dt_s=np.random.default_rng(int(rng[1])).uniform(1, 3, b).astype(np.float32),
                values_old=np.asarray(lv["values"])), np.asarray(lv["logprobs"])


def test_ppo_raises_token_reward(params):
    """reward = fraction of the 8 response slots holding token 7 (1/64 by chance); 20 steps
    (in a trial run the mean reward went 0.01 -> 0.8 over these steps, and -> 1 by step 25)."""
    cfg = LearnerConfig(actor_lr=3e-3, critic_lr=3e-3, ppo_epochs=2, num_minibatches=2,
                        max_grad_norm=1.0, entropy_coef=0.0)
    learner = make_learner(TINY, cfg, shd.make_mesh(data=2, fsdp=1, tensor=1,
                                                    devices=jax.devices()[:2]))
    sampler = Sampler(TINY, stop_token_ids=[STOP], pad_id=0, prompt_buckets=(PROMPT_LEN,),
                      batch_buckets=(32,), new_token_buckets=(NEW,), max_new_tokens=NEW)
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(2, 64, rng.integers(2, PROMPT_LEN + 1))) for _ in range(32)]
    rewards = []
    for step in range(20):
        batch, recomputed = _rollout(sampler, learner, state, prompts, jax.random.PRNGKey(step))
        if step == 0:  # the sampler's behaviour log-probs line up with the learner's
            m = batch["response_mask"] > 0
            np.testing.assert_allclose(recomputed[m], batch["old_logprobs"][m], atol=1e-4)
        state, metrics = learner.train_step(state, batch)
        rewards.append(float(metrics["reward_mean"]))
        assert np.isfinite(float(metrics["loss"]))
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > max(0.3, 5 * first), rewards


@pytest.mark.parametrize("truncation", [dict(min_p=0.3), dict(top_k=6, top_p=0.8, min_p=0.05)],
                         ids=["min_p", "all_three"])
def test_truncated_sampling_and_learner_agree(params, truncation):
    """Sampled with truncation at temperature 0.7, the learner configured alike recomputes the
    sampler's behaviour log-probs (the single-pass step's gap metric is ~0), and a train step
    on the batch is finite."""
    cfg = LearnerConfig(actor_lr=1e-3, critic="none", advantage_estimator="rloo",
                        temperature=0.7, **truncation)
    learner = make_learner(TINY, cfg, shd.make_mesh(**ONE_DEVICE))
    sampler = Sampler(TINY, stop_token_ids=[STOP], pad_id=0, prompt_buckets=(PROMPT_LEN,),
                      batch_buckets=(16,), new_token_buckets=(NEW,), max_new_tokens=NEW)
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    rng = np.random.default_rng(3)
    prompts = [list(rng.integers(2, 64, rng.integers(2, PROMPT_LEN + 1))) for _ in range(16)]
    batch, recomputed = _rollout(sampler, learner, state, prompts, jax.random.PRNGKey(5),
                                 temperature=0.7, **truncation)
    m = batch["response_mask"] > 0
    np.testing.assert_allclose(recomputed[m], batch["old_logprobs"][m], atol=1e-4)
    # Without the truncation the learner's log-probs are those of another distribution.
    plain = make_learner(TINY, dataclasses.replace(cfg, top_k=0, top_p=1.0, min_p=0.0),
                         shd.make_mesh(**ONE_DEVICE))
    untruncated = np.asarray(plain.compute_logprobs(state.policy_params, batch["tokens"],
                                                    batch["attention_mask"]))
    assert np.abs(untruncated[m] - batch["old_logprobs"][m]).max() > 1e-2
    del batch["values_old"]
    batch["fresh"] = np.ones(len(prompts), np.float32)
    _, metrics = learner.train_step(state, batch)
    metrics = jax.device_get(metrics)
    assert float(metrics["behaviour_logp_gap_max"]) < 1e-4
    assert all(np.isfinite(float(v)) for v in metrics.values())


def test_compiled_ahead_the_step_compiles_nothing(params):
    """compile_train_step (abstract state, the batch's avals) fills the cache the call reads:
    the step then runs with no XLA compile, for each length compiled ahead."""
    learner = make_learner(TINY, LearnerConfig(), shd.make_mesh(data=2, fsdp=1, tensor=1,
                                                                devices=jax.devices()[:2]))
    state = learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    for t in (16, 20):
        learner.compile_train_step(_batch(t=t, seed=4))  # other values, same shapes and keys
        before = backend_compiles()
        state, metrics = learner.train_step(state, _batch(t=t, seed=3))
        assert np.isfinite(float(metrics["loss"]))
        assert backend_compiles() == before, f"length {t} compiled again"
    assert int(state.step) == 2


def test_run_once_leaves_the_state_as_it_was(params):
    """run_once executes the step on a copy (the warm-up's page touch): the state is neither
    donated nor changed, and the next real step equals one taken without it."""
    learner = make_learner(TINY, LearnerConfig(), shd.make_mesh(data=1, fsdp=1, tensor=1,
                                                                devices=jax.devices()[:1]))
    fresh = lambda: learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    state, plain = fresh(), fresh()
    before = jax.tree.map(np.asarray, state)
    learner.run_once(state, _batch(seed=4))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state), before)
    state, m1 = learner.train_step(state, _batch(seed=3))
    plain, m2 = learner.train_step(plain, _batch(seed=3))
    assert int(state.step) == 1
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, state.policy_params),
                 jax.tree.map(np.asarray, plain.policy_params))
    assert float(m1["loss"]) == float(m2["loss"])


def test_logits_start():
    m = np.zeros((3, 40), np.float32)
    m[0, 21:30] = 1
    m[1, 25:] = 1
    assert logits_start(m) == 16  # the position before column 21, down to a multiple of 8
    assert logits_start(np.zeros((2, 10))) == 0  # no response: every position
    m = np.zeros((2, 10))
    m[1, 0] = 1
    assert logits_start(m) == 0


@pytest.mark.parametrize("config", [FULL, LearnerConfig(critic="shared")],
                         ids=["two_updates", "single_pass_shared"])
def test_step_skips_the_prompts_logits_exactly(params, config):
    """The step reads the logits from where the responses start (logits_start): the same
    params and metrics as with the logits of every position."""
    batch = _batch(t=40, seed=5)
    batch["response_mask"][:, :21] = 0
    learner = make_learner(TINY, config, shd.make_mesh(data=1, fsdp=1, tensor=1,
                                                        devices=jax.devices()[:1]))
    fresh = lambda: learner.init_state(learner.shard_params(params), jax.random.PRNGKey(1))
    placed, start = learner.step_inputs(batch)
    assert start == 16
    skip, m_skip = learner.train_step(fresh(), batch)
    full, m_full = learner.train_step_jit(fresh(), placed, 0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 jax.tree.map(np.asarray, skip.policy_params),
                 jax.tree.map(np.asarray, full.policy_params))
    for k in m_full:
        np.testing.assert_allclose(float(m_skip[k]), float(m_full[k]), rtol=1e-4, atol=1e-6,
                                   err_msg=k)


def test_failure_credit_masks_only_the_policy_gradient(params):
    """failure_credit='error_line': a row's advantage applies to its credited tokens only.
    All tokens credited → the paper's step exactly; none credited → the policy does not move
    while the critic learns exactly as with sequence credit; in between → the sequence
    advantages (whitened over every response token) times the mask."""
    base = LearnerConfig(actor_lr=1e-3, critic_lr=2e-3, adam_eps=1e-6,
                         duration_weighting="batch_mean")
    line = dataclasses.replace(base, failure_credit="error_line")
    batch = _batch(seed=3)
    mask = (batch["response_mask"] * batch["attention_mask"]).astype(np.float32)
    seq_state, _ = _one_step(base, ONE_DEVICE, params, batch)
    all_state, metrics = _one_step(line, ONE_DEVICE, params, {**batch, "credit_mask": mask})
    _assert_close(all_state.policy_params, seq_state.policy_params)
    assert metrics["credit_masked_frac"] == pytest.approx(0.0)
    none_state, metrics = _one_step(line, ONE_DEVICE, params,
                                    {**batch, "credit_mask": np.zeros_like(mask)})
    _assert_close(none_state.policy_params, params, rtol=0, atol=0)
    _assert_close(none_state.critic_params, seq_state.critic_params)
    assert metrics["credit_masked_frac"] == pytest.approx(1.0)

    credit = mask.copy()
    credit[0, 6:8] = 0  # row 0: only its last tokens credited
    learner = make_learner(TINY, line, shd.make_mesh(**ONE_DEVICE))
    x = {"rewards": jnp.asarray(batch["rewards"]), "mask": jnp.asarray(mask),
         "credit_mask": jnp.asarray(credit)}
    values = jnp.asarray(batch["values_old"])
    got = learner._advantages(x, values)
    want = make_learner(TINY, base, shd.make_mesh(**ONE_DEVICE))._advantages(x, values)
    np.testing.assert_allclose(got.advantages_bt, want.advantages_bt * credit, rtol=1e-6)
    np.testing.assert_allclose(got.returns_bt, want.returns_bt, rtol=1e-6)
    with pytest.raises(KeyError, match="credit_mask"):
        learner.prepare_batch(batch)
    with pytest.raises(ValueError, match="credit_mask"):
        learner.prepare_batch({**batch, "credit_mask": mask * 0.5})
