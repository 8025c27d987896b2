"""Qwen2 decoder in Flax linen, numerically matching transformers' `Qwen2ForCausalLM`.

The public surface is functional: `init_params`, `forward`, `logits` take a `Qwen2Config` and a
plain (unboxed) nested dict of parameters. Kernels are laid out [in, out] with heads split out
(q_proj kernel [H, nH, D], o_proj kernel [nH, D, H]); every parameter carries logical axis names
(`param_logical_axes`) that a rules table maps onto a mesh.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rl4mle_jax.models.presets import Qwen2Config

Params = dict[str, Any]

# A finite "minus infinity": a query whose keys are all masked (a pad position under left
# padding) then gets a uniform softmax instead of NaN.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_kernel_init = nn.initializers.normal(stddev=0.02)  # HF initializer_range


class KVCache(NamedTuple):
    """Per-layer key/value slots plus which slots hold real tokens.

    k, v: tuples (one entry per layer) of [B, S, nKV, D]; mask: [B, S] int32 (1 = real key).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array


def _param(module: nn.Module, name: str, init, shape, axes, dtype):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class RMSNorm(nn.Module):
    eps: float
    param_dtype: Any

    @nn.compact
    def __call__(self, x):
        scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("norm",),
                       self.param_dtype)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return scale.astype(x.dtype) * y.astype(x.dtype)


class Projection(nn.Module):
    """x [..., in] -> [..., *features] with an [in, *features] kernel and optional bias."""

    features: tuple[int, ...]
    axes: tuple[str, ...]  # logical names of (in, *features)
    use_bias: bool
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x, contract: int = 1):
        in_shape = x.shape[x.ndim - contract:]
        kernel = _param(self, "kernel", _kernel_init, (*in_shape, *self.features), self.axes,
                        self.param_dtype)
        y = jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=contract)
        if self.use_bias:
            bias = _param(self, "bias", nn.initializers.zeros, self.features,
                          self.axes[contract:], self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y


def rope_cos_sin(positions_bt: jax.Array, head_dim: int, theta: float):
    """cos, sin [B, T, D] in float32, in HF's `concat(freqs, freqs)` layout."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_bthd: jax.Array, cos_btd: jax.Array, sin_btd: jax.Array) -> jax.Array:
    half = x_bthd.shape[-1] // 2
    rotated = jnp.concatenate([-x_bthd[..., half:], x_bthd[..., :half]], axis=-1)
    cos = cos_btd[:, :, None, :].astype(x_bthd.dtype)  # HF casts cos/sin to the compute dtype
    sin = sin_btd[:, :, None, :].astype(x_bthd.dtype)
    return x_bthd * cos + rotated * sin


def write_rows(cache_bs: jax.Array, block_bt: jax.Array, index: jax.Array | int) -> jax.Array:
    """Writes block [B, T, ...] into cache [B, S, ...] at slot `index` (an int, or [B] per row).

    A per-row index lets each batch row (a decode slot of the continuous-batching engine) sit
    at its own length; a scalar keeps the one shared slot of the static-batch sampler.
    """
    zeros = (0,) * (cache_bs.ndim - 2)
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice(cache_bs, block_bt, (0, index, *zeros))
    return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (i, *zeros)))(
        cache_bs, block_bt, index)


class Embed(nn.Module):
    vocab_size: int
    features: int
    dtype: Any
    param_dtype: Any

    def setup(self):
        self.embedding = _param(self, "embedding", _kernel_init, (self.vocab_size, self.features),
                                ("vocab", "embed"), self.param_dtype)

    def __call__(self, tokens_bt):
        return jnp.take(self.embedding, tokens_bt, axis=0).astype(self.dtype)

    def attend(self, x_bth):
        """Tied output layer: logits = x @ embedding.T, accumulated in float32."""
        return jnp.einsum("bth,vh->btv", x_bth, self.embedding.astype(self.dtype),
                          preferred_element_type=jnp.float32)


class LMHead(nn.Module):
    vocab_size: int
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x_bth):
        kernel = _param(self, "kernel", _kernel_init, (x_bth.shape[-1], self.vocab_size),
                        ("embed", "vocab"), self.param_dtype)
        return jnp.einsum("bth,hv->btv", x_bth, kernel.astype(self.dtype),
                          preferred_element_type=jnp.float32)


# Query chunk of the causal attention without a cache (`attention_chunk`): query rows
# [i, i + c) attend to keys [0, i + c) only, so the masked upper triangle is mostly skipped and
# each chunk's [c, i + c] scores stay in cache. On the default run's train step (tiny preset,
# 8 x 1024 tokens, 2 cores) 128 made attention ~3.4x faster and the step ~2x
# (scripts/bench_train_step.py --real --modes one-block,default); 0 computes one block.
ATTENTION_CHUNK = 128
# At most this many chunks per layer (the chunk grows with T beyond 16 x 128): each chunk is
# its own einsum in the compiled program, and the share of scores skipped is (n - 1) / 2n.
ATTENTION_MAX_CHUNKS = 16


def attention_chunk_size(t: int, chunk: int | None = None) -> int:
    """Query rows per chunk for a causal block of t tokens (t itself: one block)."""
    chunk = ATTENTION_CHUNK if chunk is None else chunk
    if chunk <= 0 or chunk >= t:
        return t
    return max(chunk, -(-t // ATTENTION_MAX_CHUNKS))


def _attend(q_btkgd, k_bskd, v_bskd, allowed_bts, dt):
    """Softmax attention of grouped queries over keys (scores and softmax in float32)."""
    b, t, _, _, d = q_btkgd.shape
    scores = jnp.einsum("btkgd,bskd->bkgts", q_btkgd, k_bskd.astype(dt),
                        preferred_element_type=jnp.float32) * (d ** -0.5)
    scores = jnp.where(allowed_bts[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v_bskd.astype(dt)).reshape(b, t, -1, d)


class Attention(nn.Module):
    config: Qwen2Config
    chunk: int | None = None  # attention_chunk_size's chunk (None: ATTENTION_CHUNK)

    @nn.compact
    def __call__(self, x_bth, cos_btd, sin_btd, allowed_bts, cache_kv=None, cache_index=None):
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.params_dtype
        nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        proj = functools.partial(Projection, dtype=dt, param_dtype=pdt)
        q = proj((nq, d), ("embed", "heads", "head_dim"), True, name="q_proj")(x_bth)
        k = proj((nkv, d), ("embed", "kv_heads", "head_dim"), True, name="k_proj")(x_bth)
        v = proj((nkv, d), ("embed", "kv_heads", "head_dim"), True, name="v_proj")(x_bth)
        q = apply_rope(q, cos_btd, sin_btd)
        k = apply_rope(k, cos_btd, sin_btd)
        new_kv = None
        if cache_kv is not None:  # write this block at its slots, then attend over all slots
            cache_k, cache_v = cache_kv
            k = write_rows(cache_k, k.astype(cache_k.dtype), cache_index)
            v = write_rows(cache_v, v.astype(cache_v.dtype), cache_index)
            new_kv = (k, v)
        b, t = q.shape[:2]
        q = q.reshape(b, t, nkv, cfg.num_groups, d)  # query head n uses kv head n // groups
        # Query row j sits at slot `offset + j` (no cache: 0; a prefill at a static slot: that
        # slot) and reaches keys at slots <= its own only, so rows [i, i + c) need keys
        # [0, offset + i + c): dropping the rest changes no row that has a key. (A row with
        # none, a pad position, averages the values it is given; nothing reads it.) A traced
        # cache_index (decode steps) attends in one block.
        offset = 0 if cache_kv is None else cache_index if isinstance(cache_index, int) else None
        c = t if offset is None else attention_chunk_size(t, self.chunk)
        if c >= t:
            out = _attend(q, k, v, allowed_bts, dt)
        else:
            out = jnp.concatenate(
                [_attend(q[:, i:i + c], k[:, :offset + i + c], v[:, :offset + i + c],
                         allowed_bts[:, i:i + c, :offset + i + c], dt)
                 for i in range(0, t, c)], axis=1)
        out = proj((cfg.hidden_size,), ("heads", "head_dim", "embed"), False,
                   name="o_proj")(out, contract=2)
        return out, new_kv


class MLP(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        proj = functools.partial(Projection, use_bias=False, dtype=cfg.compute_dtype,
                                 param_dtype=cfg.params_dtype)
        i, h = cfg.intermediate_size, cfg.hidden_size
        gate = proj((i,), ("embed", "mlp"), name="gate_proj")(x)
        up = proj((i,), ("embed", "mlp"), name="up_proj")(x)
        return proj((h,), ("mlp", "embed"), name="down_proj")(jax.nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    config: Qwen2Config
    attention_chunk: int | None = None

    @nn.compact
    def __call__(self, x, cos, sin, allowed, cache_kv=None, cache_index=None):
        cfg = self.config
        norm = functools.partial(RMSNorm, cfg.rms_norm_eps, cfg.params_dtype)
        attn_out, new_kv = Attention(cfg, self.attention_chunk, name="self_attn")(
            norm(name="input_layernorm")(x), cos, sin, allowed, cache_kv, cache_index)
        x = x + attn_out
        x = x + MLP(cfg, name="mlp")(norm(name="post_attention_layernorm")(x))
        return x, new_kv


class Qwen2(nn.Module):
    """Returns (logits_btv float32, new_kv tuple or None, final hidden [B, T, H]).

    logits_from: the unembedding runs on positions [logits_from, T) only (logits
    [B, T - logits_from, V]); a learner that scores response tokens skips the prompt's."""

    config: Qwen2Config
    remat: bool = False
    logits_from: int = 0
    attention_chunk: int | None = None  # None: ATTENTION_CHUNK; 0: one [T, T] block

    @nn.compact
    def __call__(self, tokens_bt, positions_bt, allowed_bts, kv=None, cache_index=None):
        cfg = self.config
        dt = cfg.compute_dtype
        embed = Embed(cfg.vocab_size, cfg.hidden_size, dt, cfg.params_dtype, name="embed_tokens")
        x = embed(tokens_bt)
        cos, sin = rope_cos_sin(positions_bt, cfg.head_dim, cfg.rope_theta)
        layer_cls = nn.remat(DecoderLayer) if self.remat else DecoderLayer
        new_kv = []
        for i in range(cfg.num_hidden_layers):
            layer_kv = None if kv is None else (kv[0][i], kv[1][i])
            x, layer_new = layer_cls(cfg, self.attention_chunk, name=f"layers_{i}")(
                x, cos, sin, allowed_bts, layer_kv, cache_index)
            new_kv.append(layer_new)
        x = RMSNorm(cfg.rms_norm_eps, cfg.params_dtype, name="norm")(x)
        head_in = x[:, self.logits_from:] if self.logits_from else x
        if cfg.tie_word_embeddings:
            logits = embed.attend(head_in)
        else:
            logits = LMHead(cfg.vocab_size, dt, cfg.params_dtype, name="lm_head")(head_in)
        kv_out = None if kv is None else (tuple(p[0] for p in new_kv), tuple(p[1] for p in new_kv))
        return logits.astype(jnp.float32), kv_out, x


# ---------------------------------------------------------------------------------------------
# Functional API
# ---------------------------------------------------------------------------------------------


def _dummy_inputs():
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, tokens, jnp.ones((1, 1, 1), bool)


def _boxed_init(config: Qwen2Config, rng: jax.Array):
    return Qwen2(config).init(rng, *_dummy_inputs())["params"]


def init_params(config: Qwen2Config, rng: jax.Array) -> Params:
    """Random parameters (normal(0.02) kernels and embeddings, zero biases, unit norm scales)."""
    boxed = jax.jit(_boxed_init, static_argnums=0)(config, rng)
    return _to_dict(nn.meta.unbox(boxed))


def param_logical_axes(config: Qwen2Config) -> dict[str, Any]:
    """Same tree as the params, each leaf a tuple of logical axis names, e.g. ("embed", "mlp")."""
    boxed = jax.eval_shape(functools.partial(_boxed_init, config), jax.random.key(0))
    names = jax.tree.map(lambda b: tuple(b.names), boxed,
                         is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    return _to_dict(names)


def param_shapes(config: Qwen2Config) -> dict[str, Any]:
    """Same tree as the params with `jax.ShapeDtypeStruct` leaves (no memory allocated)."""
    boxed = jax.eval_shape(functools.partial(_boxed_init, config), jax.random.key(0))
    return _to_dict(nn.meta.unbox(boxed))


def _to_dict(tree):
    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {k: _to_dict(v) for k, v in tree.items()}
    return tree


def positions_from_mask(attention_mask_bt: jax.Array) -> jax.Array:
    """Left padding: position of each real token counts real tokens before it (pads get 0)."""
    mask = attention_mask_bt.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


def init_cache(config: Qwen2Config, batch: int, max_len: int, dtype: Any = None) -> KVCache:
    """Empty cache of `max_len` slots; dtype defaults to the compute dtype."""
    dtype = config.compute_dtype if dtype is None else jnp.dtype(dtype)
    shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
    layers = range(config.num_hidden_layers)
    return KVCache(k=tuple(jnp.zeros(shape, dtype) for _ in layers),
                   v=tuple(jnp.zeros(shape, dtype) for _ in layers),
                   mask=jnp.zeros((batch, max_len), jnp.int32))


def grow_cache(cache: KVCache, max_len: int) -> KVCache:
    """`cache` with empty slots appended up to `max_len` slots; the slots it has keep their keys,
    values and mask (an empty slot's mask is 0, so attention gives it weight 0)."""
    extra = max_len - cache.mask.shape[1]
    if extra < 0:
        raise ValueError(f"grow_cache: the cache has {cache.mask.shape[1]} slots, more than "
                         f"max_len={max_len}")
    if extra == 0:
        return cache

    def pad(x):
        return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2))

    return KVCache(k=tuple(map(pad, cache.k)), v=tuple(map(pad, cache.v)), mask=pad(cache.mask))


def forward_with_hidden(config: Qwen2Config, params: Params, tokens_bt: jax.Array,
                        positions_bt: jax.Array, attention_mask_bt: jax.Array | None = None,
                        cache: KVCache | None = None, cache_index: jax.Array | int | None = None,
                        *, remat: bool = False, logits_from: int = 0,
                        attention_chunk: int | None = None
                        ) -> tuple[jax.Array, KVCache | None, jax.Array]:
    """Like `forward`, also returning the final-norm hidden states [B, T, H] (compute dtype).
    logits_from (static): logits of positions [logits_from, T) only."""
    b, t = tokens_bt.shape
    if attention_mask_bt is None:
        attention_mask_bt = jnp.ones((b, t), jnp.int32)
    if cache is None:
        query_slots = jnp.arange(t)
        key_mask_bs = attention_mask_bt.astype(bool)
        kv = None
    else:
        if cache_index is None:
            raise ValueError("forward with a cache needs cache_index (slot of tokens_bt[:, 0])")
        new_mask = write_rows(cache.mask, attention_mask_bt.astype(cache.mask.dtype),
                              cache_index)
        # [T] for a shared index, [B, T] for one index per row.
        query_slots = jnp.asarray(cache_index)[..., None] + jnp.arange(t)
        key_mask_bs = new_mask.astype(bool)
        kv = (cache.k, cache.v)
    key_slots = jnp.arange(key_mask_bs.shape[1])
    causal_bts = key_slots <= query_slots[..., None]  # [T, S] or [B, T, S]
    allowed_bts = causal_bts & key_mask_bs[:, None, :]
    logits_btv, new_kv, hidden = Qwen2(config, remat=remat, logits_from=logits_from,
                                       attention_chunk=attention_chunk).apply(
        {"params": params}, tokens_bt, positions_bt, allowed_bts, kv, cache_index)
    new_cache = None if cache is None else KVCache(new_kv[0], new_kv[1], new_mask)
    return logits_btv, new_cache, hidden


def forward(config: Qwen2Config, params: Params, tokens_bt: jax.Array, positions_bt: jax.Array,
            attention_mask_bt: jax.Array | None = None, cache: KVCache | None = None,
            cache_index: jax.Array | int | None = None, *, remat: bool = False,
            logits_from: int = 0, attention_chunk: int | None = None
            ) -> tuple[jax.Array, KVCache | None]:
    """Returns (logits_btv float32, new_cache).

    Without a cache, token t attends to tokens <= t whose mask is 1. With a cache, the block is
    written at slots [cache_index, cache_index + T) and attends to every slot <= its own whose
    cache mask is 1 (the block's own mask is written into the cache mask first). cache_index is
    one slot for the whole batch or, as a [B] array, one per row. logits_from (static): the
    logits of positions [logits_from, T) only, [B, T - logits_from, V]. attention_chunk
    (static; without a cache, or with a Python-int cache_index as a prefill has): query rows
    per causal attention chunk (`attention_chunk_size`; None: ATTENTION_CHUNK, 0: one block);
    the result is the same up to float rounding.
    """
    logits_btv, new_cache, _ = forward_with_hidden(config, params, tokens_bt, positions_bt,
                                                   attention_mask_bt, cache, cache_index,
                                                   remat=remat, logits_from=logits_from,
                                                   attention_chunk=attention_chunk)
    return logits_btv, new_cache


def logits(config: Qwen2Config, params: Params, tokens: jax.Array,
           attention_mask: jax.Array | None = None) -> jax.Array:
    """[B, T, V] float32 logits of a (left-padded) batch; positions = cumsum(mask) - 1."""
    if attention_mask is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    else:
        positions = positions_from_mask(attention_mask)
    return forward(config, params, tokens, positions, attention_mask)[0]
