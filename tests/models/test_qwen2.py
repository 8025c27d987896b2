"""Qwen2 in Flax: layout, formulas against NumPy, logits parity with transformers, KV cache."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.models import (
    Qwen2Config,
    forward,
    get_preset,
    init_cache,
    init_params,
    load_hf_checkpoint,
    logits,
    param_logical_axes,
    param_shapes,
    positions_from_mask,
)
from rl4mle_jax.models.qwen2 import RMSNorm, apply_rope, rope_cos_sin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tests.models.hf_utils import hf_logits, make_hf_model  # noqa: E402

jit_logits = jax.jit(logits, static_argnums=0)
jit_forward = jax.jit(forward, static_argnums=0, static_argnames="attention_chunk")


def random_params(cfg, seed=0, scale=0.1):
    """NumPy-drawn params (no init compile): kernels N(0, scale), norm scales around 1."""
    rng = np.random.RandomState(seed)
    draw = lambda s: rng.normal(1.0 if s.ndim == 1 and s.shape[0] == cfg.hidden_size else 0.0,
                                scale, s.shape).astype(np.float32)
    return jax.tree.map(draw, param_shapes(cfg))


def left_padded_batch(vocab, lengths, width, seed=0):
    rng = np.random.RandomState(seed)
    tokens = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, width - n:] = rng.randint(0, vocab, n)
        mask[i, width - n:] = 1
    return tokens, mask


# ---------------------------------------------------------------------------------------------
# Presets and parameter layout
# ---------------------------------------------------------------------------------------------


def test_presets_have_published_values():
    c3 = get_preset("qwen2.5-3b")
    assert (c3.num_hidden_layers, c3.hidden_size, c3.intermediate_size) == (36, 2048, 11008)
    assert (c3.num_attention_heads, c3.num_key_value_heads, c3.head_dim) == (16, 2, 128)
    assert (c3.vocab_size, c3.tie_word_embeddings, c3.rope_theta, c3.rms_norm_eps) == (
        151936, True, 1e6, 1e-6)
    c7 = get_preset("qwen2.5-7b")
    assert (c7.vocab_size, c7.tie_word_embeddings, c7.num_key_value_heads) == (152064, False, 4)
    c05 = get_preset("qwen2.5-0.5b")
    assert (c05.hidden_size, c05.num_attention_heads, c05.head_dim) == (896, 14, 64)
    c15 = get_preset("qwen2.5-1.5b")
    assert (c15.hidden_size, c15.intermediate_size, c15.num_hidden_layers) == (1536, 8960, 28)
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "tiny"):
        assert get_preset(name).max_position_embeddings == 32768
    # Published parameter counts: 0.49B, 1.54B, 3.09B, 7.62B.
    counts = [get_preset(n).num_params() / 1e9 for n in ("qwen2.5-0.5b", "qwen2.5-1.5b",
                                                          "qwen2.5-3b", "qwen2.5-7b")]
    np.testing.assert_allclose(counts, [0.494, 1.544, 3.086, 7.616], atol=0.01)
    tiny = get_preset("tiny", vocab_size=1000, dtype=jnp.bfloat16)
    assert tiny.vocab_size == 1000 and tiny.dtype == "bfloat16"
    assert hash(tiny) == hash(get_preset("tiny", vocab_size=1000, dtype="bfloat16"))
    with pytest.raises(KeyError, match="unknown model preset 'qwen9'"):
        get_preset("qwen9")
    with pytest.raises(ValueError, match="not a multiple"):
        Qwen2Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=3, num_key_value_heads=2, head_dim=4)


@pytest.mark.parametrize("tied", [True, False])
def test_param_tree_layout_and_logical_axes(tied):
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=2, tie_word_embeddings=tied)
    params = param_shapes(cfg)  # the tree init_params returns, without compiling it
    h, v, i, nq, nkv, d = 128, 64, 384, 4, 2, 32
    expected_top = {"embed_tokens", "layers_0", "layers_1", "norm"} | ({"lm_head"} if not tied
                                                                          else set())
    assert set(params) == expected_top and type(params) is dict
    assert type(params["layers_0"]["self_attn"]) is dict
    layer = params["layers_1"]
    shapes = jax.tree.map(lambda x: tuple(x.shape), layer)
    assert shapes == {
        "input_layernorm": {"scale": (h,)}, "post_attention_layernorm": {"scale": (h,)},
        "self_attn": {"q_proj": {"kernel": (h, nq, d), "bias": (nq, d)},
                      "k_proj": {"kernel": (h, nkv, d), "bias": (nkv, d)},
                      "v_proj": {"kernel": (h, nkv, d), "bias": (nkv, d)},
                      "o_proj": {"kernel": (nq, d, h)}},
        "mlp": {"gate_proj": {"kernel": (h, i)}, "up_proj": {"kernel": (h, i)},
                "down_proj": {"kernel": (i, h)}}}
    assert params["embed_tokens"]["embedding"].shape == (v, h)
    if not tied:
        assert params["lm_head"]["kernel"].shape == (h, v)
    axes = param_logical_axes(cfg)
    is_tuple = lambda x: isinstance(x, tuple)
    assert jax.tree.structure(axes, is_leaf=is_tuple) == jax.tree.structure(params)
    # Each name tuple has one name per array dimension.
    jax.tree.map(lambda a, p: a if len(a) == p.ndim else pytest.fail(f"{a} vs {p.shape}"),
                 axes, params, is_leaf=is_tuple)
    assert axes["embed_tokens"]["embedding"] == ("vocab", "embed")
    assert axes["layers_0"]["self_attn"]["q_proj"]["kernel"] == ("embed", "heads", "head_dim")
    assert axes["layers_0"]["self_attn"]["k_proj"]["bias"] == ("kv_heads", "head_dim")
    assert axes["layers_0"]["self_attn"]["o_proj"]["kernel"] == ("heads", "head_dim", "embed")
    assert axes["layers_0"]["mlp"]["down_proj"]["kernel"] == ("mlp", "embed")
    assert axes["norm"]["scale"] == ("norm",)


def test_init_params_values():
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=1)
    params = init_params(cfg, jax.random.key(0))
    assert jax.tree.structure(params) == jax.tree.structure(param_shapes(cfg))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
    shapes16 = param_shapes(cfg.replace(param_dtype="bfloat16"))  # same init code, traced only
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(shapes16))
    up = params["layers_0"]["mlp"]["up_proj"]["kernel"]
    assert float(jnp.std(up)) == pytest.approx(0.02, rel=0.1)  # HF initializer_range
    assert float(jnp.abs(params["layers_0"]["self_attn"]["q_proj"]["bias"]).max()) == 0.0
    assert float(params["norm"]["scale"].min()) == 1.0


# ---------------------------------------------------------------------------------------------
# Formulas against NumPy
# ---------------------------------------------------------------------------------------------


def test_rmsnorm_matches_numpy():
    x = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32) * 3
    w = np.random.RandomState(1).randn(8).astype(np.float32)
    y = RMSNorm(1e-6, jnp.float32).apply({"params": {"scale": w}}, x)
    ref = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-6)


def test_rope_matches_numpy():
    b, t, n, d, theta = 2, 5, 3, 8, 1e4
    x = np.random.RandomState(0).randn(b, t, n, d).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    cos, sin = rope_cos_sin(jnp.asarray(pos), d, theta)
    y = np.asarray(apply_rope(jnp.asarray(x), cos, sin))
    ref = np.empty_like(x)
    for bi in range(b):
        for ti in range(t):
            for j in range(d // 2):  # pairs (j, j + d/2) rotate by angle pos * theta^(-2j/d)
                ang = pos[bi, ti] * theta ** (-2 * j / d)
                a, c = x[bi, ti, :, j], x[bi, ti, :, j + d // 2]
                ref[bi, ti, :, j] = a * np.cos(ang) - c * np.sin(ang)
                ref[bi, ti, :, j + d // 2] = c * np.cos(ang) + a * np.sin(ang)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_positions_from_mask_left_padding():
    mask = jnp.array([[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 0]])
    np.testing.assert_array_equal(positions_from_mask(mask),
                                  [[0, 1, 2, 3], [0, 0, 0, 1], [0, 0, 0, 0]])


# ---------------------------------------------------------------------------------------------
# Parity with transformers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads,kv_heads,tied,head_dim",
                         [(4, 4, True, None), (4, 2, False, 24), (8, 2, True, None)])
def test_logits_match_transformers_left_padded(tmp_path, heads, kv_heads, tied, head_dim):
    """GQA ratios 1, 2, 4; tied and untied; head_dim != hidden/heads; a left-padded batch
    (real positions compared)."""
    extra = {"head_dim": head_dim} if head_dim else {}
    model = make_hf_model(tmp_path, heads=heads, kv_heads=kv_heads, tied=tied, **extra)
    cfg, params = load_hf_checkpoint(tmp_path)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (
        heads, kv_heads, tied)
    assert cfg.head_dim == (head_dim or 64 // heads)
    assert ("lm_head" in params) == (not tied)
    tokens, mask = left_padded_batch(cfg.vocab_size, [9, 5, 1, 0], 9)  # last row: all padding
    ours = np.asarray(jit_logits(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)))
    ref = hf_logits(model, tokens, mask)
    real = mask.astype(bool)
    assert np.abs(ours - ref)[real].max() <= 1e-4
    # Causal attention in chunks of 2 query rows (5 chunks of 9), as the learner runs it.
    chunked = jit_forward(cfg, params, jnp.asarray(tokens), positions_from_mask(mask), mask,
                          attention_chunk=2)[0]
    assert np.abs(np.asarray(chunked) - ref)[real].max() <= 1e-4
    assert np.isfinite(ours).all()  # pad queries see no real key: uniform softmax, not NaN
    assert np.abs(ref[real]).max() > 1.0  # the logits are not trivially tiny
    # No mask: same as an all-ones mask.
    full = np.asarray(jit_logits(cfg, params, jnp.asarray(tokens[:1])))
    np.testing.assert_allclose(full, ours[:1], atol=1e-5)


def test_bfloat16_compute_close_to_float32(tmp_path):
    make_hf_model(tmp_path, heads=4, kv_heads=2)
    cfg, params = load_hf_checkpoint(tmp_path)
    tokens, mask = left_padded_batch(cfg.vocab_size, [8, 6], 8)
    ref = np.asarray(jit_logits(cfg, params, tokens, mask))
    cfg16, params16 = load_hf_checkpoint(tmp_path, dtype=jnp.bfloat16)
    assert cfg16.dtype == cfg16.param_dtype == "bfloat16"
    assert params16["norm"]["scale"].dtype == jnp.bfloat16
    out = jit_logits(cfg16, params16, tokens, mask)
    assert out.dtype == jnp.float32
    real = mask.astype(bool)
    err = np.abs(np.asarray(out) - ref)[real]
    assert err.max() < 0.05 * np.abs(ref[real]).max(), err.max()


# ---------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------


def test_cache_prefill_then_decode_matches_full_forward():
    """Left-padded prompts in a bucket, prefill, 5 single-token steps and one 3-token chunk."""
    cfg = get_preset("tiny", vocab_size=128, num_hidden_layers=2, rope_theta=1e4)
    params = random_params(cfg, seed=1, scale=0.15)
    bucket, n_new = 8, 8
    lengths = [6, 3, 8]
    prompt, prompt_mask = left_padded_batch(cfg.vocab_size, lengths, bucket, seed=2)
    new = np.random.RandomState(3).randint(0, cfg.vocab_size, (3, n_new)).astype(np.int32)
    tokens = np.concatenate([prompt, new], 1)
    mask = np.concatenate([prompt_mask, np.ones_like(new)], 1)
    full = np.asarray(jit_logits(cfg, params, tokens, mask))

    cache = init_cache(cfg, batch=3, max_len=bucket + n_new + 4)  # spare slots stay masked
    positions = positions_from_mask(jnp.asarray(prompt_mask))
    out, cache = jit_forward(cfg, params, prompt, positions, prompt_mask, cache, 0)
    got = [np.asarray(out)]
    next_pos = np.asarray(lengths)[:, None]
    for step in range(5):
        tok = new[:, step:step + 1]
        out, cache = jit_forward(cfg, params, tok, next_pos + step, np.ones_like(tok), cache,
                                 bucket + step)
        got.append(np.asarray(out))
    chunk = new[:, 5:8]
    out, cache = jit_forward(cfg, params, chunk, next_pos + 5 + np.arange(3), np.ones_like(chunk),
                             cache, bucket + 5)
    got.append(np.asarray(out))
    got = np.concatenate(got, 1)
    real = mask.astype(bool)
    assert np.abs(got - full)[real].max() <= 1e-4
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(np.asarray(cache.mask)[:, :bucket + n_new], mask)
    assert not np.asarray(cache.mask)[:, bucket + n_new:].any()
    assert len(cache.k) == cfg.num_hidden_layers and cache.k[0].shape == (3, 20, 2, 32)


def test_prefill_at_a_static_slot_in_chunks_matches_one_block():
    """A prefill with a Python-int cache_index (the sampler's) attends in causal chunks: the
    same logits and cache as one block, at slot 0 and behind earlier slots."""
    cfg = get_preset("tiny", vocab_size=128, num_hidden_layers=2, rope_theta=1e4)
    params = random_params(cfg, seed=1, scale=0.15)
    prompt, prompt_mask = left_padded_batch(cfg.vocab_size, [11, 4, 13], 13, seed=2)
    more = np.random.RandomState(3).randint(0, cfg.vocab_size, (3, 7)).astype(np.int32)
    positions = positions_from_mask(jnp.asarray(prompt_mask))
    out = {}
    for chunk in (0, 3):
        cache = init_cache(cfg, batch=3, max_len=24)
        a, cache = forward(cfg, params, prompt, positions, prompt_mask, cache, 0,
                           attention_chunk=chunk)
        b, cache = forward(cfg, params, more, positions[:, -1:] + 1 + np.arange(7),
                           np.ones_like(more), cache, 13, attention_chunk=chunk)
        out[chunk] = (np.asarray(a), np.asarray(b), cache)
    real = prompt_mask.astype(bool)
    assert np.abs(out[0][0] - out[3][0])[real].max() <= 1e-5
    assert np.abs(out[0][1] - out[3][1]).max() <= 1e-5
    # The cache agrees at the real slots (a pad slot holds what its pad row computed; masked,
    # nothing reads it).
    cache0, cache3 = out[0][2], out[3][2]
    np.testing.assert_array_equal(cache0.mask, cache3.mask)
    slots = np.asarray(cache0.mask).astype(bool)
    for x, y in zip(cache0.k + cache0.v, cache3.k + cache3.v):
        np.testing.assert_allclose(np.asarray(x)[slots], np.asarray(y)[slots], atol=1e-5)


def test_attention_chunks_give_same_values_and_gradients():
    """Chunked causal attention (the learner's default) against one [T, T] block: values and
    gradients of a masked loss on a left-padded batch with an all-padding row."""
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=2, hidden_size=32,
                     intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=8)
    params = random_params(cfg, scale=0.2)
    tokens, mask = left_padded_batch(64, [21, 9, 0, 17], 21)
    positions = positions_from_mask(jnp.asarray(mask))

    def loss(p, chunk):
        out = forward(cfg, p, tokens, positions, mask, attention_chunk=chunk)[0]
        nll = jax.nn.logsumexp(out, -1) - out[..., 0]
        return jnp.sum(nll * mask) / jnp.sum(mask)

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    v0, g0 = grad(params, 0)
    for chunk in (1, 4, 20):
        v, g = grad(params, chunk)
        np.testing.assert_allclose(v, v0, rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g, g0)
    assert float(jnp.abs(g0["layers_0"]["self_attn"]["k_proj"]["kernel"]).max()) > 0


def test_attention_chunk_size():
    from rl4mle_jax.models.qwen2 import ATTENTION_CHUNK, ATTENTION_MAX_CHUNKS, attention_chunk_size
    from rl4mle_jax.rl.learner_config import LearnerConfig

    # The learner's config (JAX-free, so it writes the number out) and the model's default (the
    # sampler's) agree.
    assert LearnerConfig().attention_chunk == ATTENTION_CHUNK
    assert attention_chunk_size(1024) == 128  # the default: 8 chunks
    assert attention_chunk_size(100) == 100  # shorter than a chunk: one block
    assert attention_chunk_size(1024, 0) == 1024  # 0: one block
    assert attention_chunk_size(1000, 64) == 64
    # Long sequences: at most ATTENTION_MAX_CHUNKS chunks, the last one possibly shorter.
    for t in (4096, 5000, 32768):
        c = attention_chunk_size(t)
        assert -(-t // c) <= ATTENTION_MAX_CHUNKS and c >= 128


def test_cache_jit_donation_and_traced_index():
    """cache_index may be traced (decode loops); the updated cache keeps shape and dtype."""
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=1)
    params = random_params(cfg)
    step = jax.jit(functools.partial(forward, cfg), donate_argnames="cache")
    cache = init_cache(cfg, 2, 4, dtype=jnp.bfloat16)
    tok = jnp.ones((2, 1), jnp.int32)
    for i in range(3):
        out, cache = step(params, tok, jnp.full((2, 1), i), None, cache=cache,
                          cache_index=jnp.int32(i))
    assert cache.k[0].dtype == jnp.bfloat16 and cache.k[0].shape == (2, 4, 2, 32)
    np.testing.assert_array_equal(cache.mask, [[1, 1, 1, 0], [1, 1, 1, 0]])
    assert out.shape == (2, 1, 64) and np.isfinite(np.asarray(out)).all()
    with pytest.raises(ValueError, match="cache_index"):
        forward(cfg, params, tok, tok, None, cache)


def test_remat_gives_same_values_and_gradients():
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=1, hidden_size=32,
                     intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=16)
    params = random_params(cfg)
    tokens = jnp.arange(12).reshape(2, 6) % 64
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))

    def loss(p, remat):
        out = forward(cfg, p, tokens, positions, remat=remat)[0]
        return jnp.mean(jax.nn.logsumexp(out, -1) - out[..., 0])

    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (v0, g0), (v1, g1) = grad(params, False), grad(params, True)
    np.testing.assert_allclose(v0, v1, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g0, g1)
    assert float(jnp.abs(g0["layers_0"]["self_attn"]["k_proj"]["kernel"]).max()) > 0


@pytest.mark.parametrize("tied", [True, False])
def test_logits_from_is_a_slice_of_the_full_logits(tied):
    """forward(logits_from=k) runs the unembedding on positions [k, T) only: the same values
    as the full logits there; the hidden states and the cache are untouched."""
    cfg = get_preset("tiny", vocab_size=64, num_hidden_layers=2, hidden_size=32,
                     intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=8, tie_word_embeddings=tied)
    params = random_params(cfg)
    tokens, mask = left_padded_batch(64, [9, 5, 12], 12)
    positions = positions_from_mask(jnp.asarray(mask))
    full = jit_forward(cfg, params, tokens, positions, mask)[0]
    part = jax.jit(functools.partial(forward, cfg, logits_from=5))(params, tokens, positions,
                                                                    mask)[0]
    assert part.shape == (3, 7, 64)
    np.testing.assert_allclose(np.asarray(part), np.asarray(full)[:, 5:], rtol=1e-5, atol=1e-6)
