"""Warm-start SFT: batching, the response-only loss against a full-sequence reference, training."""

import dataclasses

import jax
import numpy as np
import pytest

from rl4mle_jax import warmstart as ws
from rl4mle_jax.models import get_preset, init_params, logits

TINY_MODEL = (("hidden_size", 32), ("intermediate_size", 64), ("num_hidden_layers", 1),
              ("num_attention_heads", 2), ("num_key_value_heads", 1), ("head_dim", 16))


def _examples():
    return [ws.SFTExample((5, 6, 7), (8, 9, 1), "solve"), ws.SFTExample((5,), (4, 1), "improve")]


def test_make_batch_pads_prompt_left_and_response_right():
    b = ws.make_batch(_examples(), 4, 4, pad_id=0)
    np.testing.assert_array_equal(b["prompt"], [[0, 5, 6, 7], [0, 0, 0, 5]])
    np.testing.assert_array_equal(b["prompt_mask"], [[0, 1, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_array_equal(b["response"], [[8, 9, 1, 0], [4, 1, 0, 0]])
    np.testing.assert_array_equal(b["response_mask"], [[1, 1, 1, 0], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="example 0 has 3 prompt / 3 response tokens"):
        ws.make_batch(_examples(), 2, 4, pad_id=0)


def test_sft_loss_matches_numpy_reference_on_the_full_sequence():
    """The cached-prompt loss equals the plain next-token NLL of prompt+response."""
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(0))
    batch = ws.make_batch(_examples(), 4, 4, pad_id=0)
    got = float(jax.jit(ws.sft_loss, static_argnums=0)(config, params, batch))
    tokens = np.concatenate([batch["prompt"], batch["response"]], 1)
    mask = np.concatenate([batch["prompt_mask"], batch["response_mask"]], 1).astype(np.int32)
    lg = np.asarray(logits(config, params, tokens, mask), np.float64)
    top = lg.max(-1, keepdims=True)
    logp = lg - top - np.log(np.exp(lg - top).sum(-1, keepdims=True))
    nll, n = 0.0, 0
    for i in range(2):
        for t in range(4, 8):  # response slots; token t is predicted at position t - 1
            if batch["response_mask"][i, t - 4]:
                nll -= logp[i, t - 1, tokens[i, t]]
                n += 1
    assert n == 5
    np.testing.assert_allclose(got, nll / n, rtol=1e-5)


def test_sft_gradient_flows_and_loss_drops():
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(0))
    batch = ws.make_batch(_examples(), 4, 4, pad_id=0)
    grads = jax.grad(lambda p: ws.sft_loss(config, p, batch))(params)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
    assert float(np.abs(grads["layers_0"]["mlp"]["up_proj"]["kernel"]).sum()) > 0
    cfg = ws.WarmStartConfig(steps=30, batch_size=2, learning_rate=1e-2, warmup_steps=2)
    _, stats = ws.train_sft(config, params, _examples(), 0, cfg)
    assert stats["loss_last10_mean"] < 0.5 * stats["loss_first10_mean"]
    assert stats["buckets"] == {"128+64": 2}


def test_shared_prompt_batch_gives_the_same_loss():
    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    params = init_params(config, jax.random.PRNGKey(1))
    exs = [ws.SFTExample((5, 6, 7), (8, 9, 1), "solve"), ws.SFTExample((5, 6, 7), (4, 1), "solve")]
    loss = jax.jit(ws.sft_loss, static_argnums=0)
    shared = ws.make_batch(exs, 4, 4, pad_id=0, shared_prompt=True)
    assert shared["prompt"].shape == (1, 4) and shared["response"].shape == (2, 4)
    np.testing.assert_allclose(float(loss(config, params, shared)),
                               float(loss(config, params, ws.make_batch(exs, 4, 4, pad_id=0))),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="different prompts"):
        ws.make_batch(_examples(), 4, 4, pad_id=0, shared_prompt=True)


def test_encode_pairs_drops_and_counts_overlong():
    tok = _FakeTok()
    pairs = [("a" * 3, "b" * 2, "solve"), ("a" * 9, "b", "solve"), ("a", "b" * 9, "improve"),
             ("a" * 5, "b" * 5, "instrument")]
    ex, dropped = ws.encode_pairs(tok, pairs, max_prompt=4, max_response=4, max_total=8)
    assert [(len(e.prompt_ids), len(e.response_ids), e.kind) for e in ex] == [(3, 3, "solve")]
    assert ex[0].response_ids[-1] == tok.eos_id
    assert dropped == {"prompt_too_long": 1, "response_too_long": 1, "total_too_long": 1}


class _FakeTok:
    eos_id = 1

    def encode(self, text):
        return [2] * len(text)


def test_average_last_returns_the_mean_of_the_last_steps_weights(monkeypatch):
    """average_last=0.5 of 6 steps: the numpy mean of the weights after steps 4, 5 and 6; the
    run itself (losses, the weights it averages) is the one average_last=0 makes."""
    from rl4mle_jax.warmstart import sft

    config = get_preset("tiny", vocab_size=16, **dict(TINY_MODEL))
    after: list = []
    make = sft.make_sft_step

    def recording(model_config, optimizer):
        step = make(model_config, optimizer)

        def run(params, opt_state, batch):
            out = step(params, opt_state, batch)
            after.append(jax.tree.map(np.asarray, out[0]))
            return out
        return run

    monkeypatch.setattr(sft, "make_sft_step", recording)
    cfg = ws.WarmStartConfig(steps=6, batch_size=2, learning_rate=1e-2, warmup_steps=2)
    last, plain = ws.train_sft(config, init_params(config, jax.random.PRNGKey(0)), _examples(),
                               0, cfg)
    trajectory, after[:] = list(after), []
    cfg = ws.WarmStartConfig(steps=6, batch_size=2, learning_rate=1e-2, warmup_steps=2,
                             average_last=0.5)
    mean, stats = ws.train_sft(config, init_params(config, jax.random.PRNGKey(0)), _examples(),
                               0, cfg)
    assert stats["averaged_steps"] == 3 and plain["averaged_steps"] == 0
    assert stats["loss_curve"] == plain["loss_curve"]
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(trajectory)):
        np.testing.assert_array_equal(a, b)
    want = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *trajectory[3:])
    for got, ref in zip(jax.tree.leaves(mean), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-7)
    for got, ref in zip(jax.tree.leaves(last), jax.tree.leaves(trajectory[-1])):
        np.testing.assert_array_equal(np.asarray(got), ref)
    with pytest.raises(ValueError, match="average_last"):
        ws.WarmStartConfig(average_last=1.0)


def test_fields_added_after_v3_keep_the_older_keys():
    """A field added later enters the cache key only when set: the cached builds still hit."""
    from rl4mle_jax.warmstart.cache import ADDED_AFTER_V3

    cfg = ws.WarmStartConfig()
    key = ws.cache_key(["t"], cfg, {"x": 1})
    assert key == "120fb88c8a43c3b8"  # the key before average_last existed (at e850e56)
    assert set(ADDED_AFTER_V3) <= {f.name for f in dataclasses.fields(cfg)}
    assert ws.cache_key(["t"], ws.WarmStartConfig(average_last=0.25), {"x": 1}) != key
    assert ws.cache_key(["t"], ws.WarmStartConfig(average_last=0.0), {"x": 1}) == key
