"""Value model: a linear value head [H] -> scalar on a Qwen2 trunk.

Two layouts of `critic_params`:
- separate trunk (verl's default): {"trunk": <policy params without lm_head>, "value_head": ...},
  the trunk initialised as a copy of the policy;
- shared trunk: {"value_head": ...} read off the policy's own final hidden states
  (`models.forward_with_hidden`), so the value loss also trains the policy trunk.

The head reads the final (normed) hidden state. Alignment: `values_bt[:, t]` is the value of
the state after reading tokens[:, :t+1]; the learner shifts it by one so that it lines up with
the log-prob of tokens[:, t+1].
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rl4mle_jax import models

Params = Any

VALUE_HEAD_AXES = {"kernel": ("embed",), "bias": ()}


def init_value_head(hidden_size: int, rng: jax.Array, dtype: Any = jnp.float32) -> Params:
    # Small init so that initial values are near 0 (the rewards' scale is unknown).
    kernel = 0.02 * jax.random.normal(rng, (hidden_size,), jnp.float32) / jnp.sqrt(hidden_size)
    return {"kernel": kernel.astype(dtype), "bias": jnp.zeros((), dtype)}


def init_critic(config: models.Qwen2Config, policy_params: Params, rng: jax.Array,
                shared_trunk: bool = False) -> Params:
    """Critic params; the separate trunk is a copy of the policy trunk (call under jit)."""
    head = init_value_head(config.hidden_size, rng,
                           policy_params["embed_tokens"]["embedding"].dtype)
    if shared_trunk:
        return {"value_head": head}
    trunk = {k: v for k, v in policy_params.items() if k != "lm_head"}
    return {"trunk": jax.tree.map(jnp.copy, trunk), "value_head": head}


def critic_logical_axes(config: models.Qwen2Config, shared_trunk: bool = False) -> Params:
    if shared_trunk:
        return {"value_head": VALUE_HEAD_AXES}
    trunk = {k: v for k, v in models.param_logical_axes(config).items() if k != "lm_head"}
    return {"trunk": trunk, "value_head": VALUE_HEAD_AXES}


def _trunk_config(config: models.Qwen2Config) -> models.Qwen2Config:
    # The trunk has no lm_head; as "tied" the model's unused logits come from the embedding
    # (and are dead code under jit). Hidden states do not depend on this flag.
    return dataclasses.replace(config, tie_word_embeddings=True)


def critic_values(config: models.Qwen2Config, critic_params: Params, tokens_bt: jax.Array,
                  attention_mask_bt: jax.Array, *, remat: bool = False,
                  attention_chunk: int | None = None) -> jax.Array:
    """Values [B, T] float32 of the separate-trunk critic."""
    _, _, hidden_bth = models.forward_with_hidden(
        _trunk_config(config), critic_params["trunk"], tokens_bt,
        models.positions_from_mask(attention_mask_bt), attention_mask_bt, remat=remat,
        attention_chunk=attention_chunk)
    return value_head_apply(critic_params["value_head"], hidden_bth)


def value_head_apply(head: Params, hidden_bth: jax.Array) -> jax.Array:
    """[B, T, H] -> [B, T] float32."""
    return (jnp.einsum("bth,h->bt", hidden_bth.astype(jnp.float32),
                       head["kernel"].astype(jnp.float32))
            + head["bias"].astype(jnp.float32))


def logits_and_shared_values(config: models.Qwen2Config, policy_params: Params,
                             value_head: Params, tokens_bt: jax.Array,
                             attention_mask_bt: jax.Array, *, remat: bool = False,
                             logits_from: int = 0, attention_chunk: int | None = None
                             ) -> tuple[jax.Array, jax.Array]:
    """(logits [B, T - logits_from, V], values [B, T]) from one policy forward (shared
    trunk)."""
    logits_btv, _, hidden_bth = models.forward_with_hidden(
        config, policy_params, tokens_bt, models.positions_from_mask(attention_mask_bt),
        attention_mask_bt, remat=remat, logits_from=logits_from, attention_chunk=attention_chunk)
    return logits_btv.astype(jnp.float32), value_head_apply(value_head, hidden_bth)


def policy_logits(config: models.Qwen2Config, policy_params: Params, tokens_bt: jax.Array,
                  attention_mask_bt: jax.Array, *, remat: bool = False,
                  logits_from: int = 0, attention_chunk: int | None = None) -> jax.Array:
    """Logits [B, T - logits_from, V] float32 of the policy (left padding)."""
    logits_btv, _ = models.forward(config, policy_params, tokens_bt,
                                   models.positions_from_mask(attention_mask_bt),
                                   attention_mask_bt, remat=remat, logits_from=logits_from,
                                   attention_chunk=attention_chunk)
    return logits_btv.astype(jnp.float32)
