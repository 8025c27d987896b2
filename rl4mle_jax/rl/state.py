"""Train state pytree and the optimizers that update it.

The frozen reference policy (KL anchor, instrumenter) is NOT part of the state: it is never
updated, so the learner holds it beside the state with the same shardings as the policy.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rl4mle_jax.rl.learner_config import LR_SCHEDULES

Params = Any


@flax.struct.dataclass
class TrainState:
    """Everything train_step reads and writes; a pytree (donated to the jitted step)."""

    step: jax.Array  # int32 [] number of train_step calls so far
    policy_params: Params
    critic_params: Params  # {} when there is no critic (group baselines)
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    rng: jax.Array  # uint32 [2] raw PRNG key (checkpoint friendly)


def make_schedule(peak_lr: float, warmup_steps: int = 0, total_steps: int = 0,
                  kind: str = "constant", min_lr_ratio: float = 0.0) -> optax.Schedule:
    """Linear warmup from 0 to peak_lr, then constant or cosine decay to min_lr_ratio·peak.

    Steps count optimizer updates (PPO epochs × minibatches per train_step).
    """
    if kind not in LR_SCHEDULES:
        raise ValueError(f"lr schedule must be one of {LR_SCHEDULES}, got {kind!r}")
    if kind == "cosine" and total_steps <= warmup_steps:
        raise ValueError(f"cosine schedule needs total_steps > warmup_steps, got "
                         f"total_steps={total_steps} warmup_steps={warmup_steps}")
    if kind == "constant":
        after = optax.constant_schedule(peak_lr)
    else:
        after = optax.cosine_decay_schedule(peak_lr, total_steps - warmup_steps,
                                            alpha=min_lr_ratio)
    if warmup_steps <= 0:
        return after
    warm = optax.linear_schedule(0.0, peak_lr, warmup_steps)
    return optax.join_schedules([warm, after], [warmup_steps])


def _decay_mask(params: Params) -> Params:
    # Weight decay on matrices only; not on norm scales or biases.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(schedule: optax.Schedule, *, max_grad_norm: float | None = 1.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   weight_decay: float = 0.0) -> optax.GradientTransformation:
    """Global-norm clipping followed by AdamW."""
    parts = []
    if max_grad_norm is not None and max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=_decay_mask))
    return optax.chain(*parts)


def create_train_state(policy_params: Params, critic_params: Params,
                       actor_opt: optax.GradientTransformation,
                       critic_opt: optax.GradientTransformation, rng: jax.Array) -> TrainState:
    """A fresh state at step 0 (call under jit so every leaf is its own buffer)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        policy_params=policy_params,
        critic_params=critic_params,
        actor_opt_state=actor_opt.init(policy_params),
        critic_opt_state=critic_opt.init(critic_params),
        rng=rng,
    )


def opt_state_shardings(opt: optax.GradientTransformation, abstract_params: Params,
                        param_shardings: Params, other: jax.sharding.Sharding) -> Any:
    """Shardings of opt.init(params): moments follow their parameter, scalars get `other`."""
    abstract_state = jax.eval_shape(opt.init, abstract_params)
    return optax.tree_map_params(
        opt, lambda _, sharding: sharding, abstract_state, param_shardings,
        transform_non_params=lambda _: other,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
