"""PPO learner: one jitted, sharded `train_step(state, batch) -> (state, metrics)`.

Per train_step, on the whole batch (before any splitting, so that the statistics are batch
level): token rewards (KL-in-reward optional) → advantages and returns (`rl.advantages`, from
the critic's values_old), duration weights (`rl.duration`). Then `ppo_epochs` ×
`num_minibatches` optimizer updates; each update accumulates gradients over micro-batches with
a `lax.scan`, every micro-batch loss normalised by its minibatch's token (or sequence) count, so
the sum equals the loss of the whole minibatch exactly.

With one update from one forward over the whole batch (`rl.batch.single_pass`, the default:
1 epoch, 1 minibatch, no micro-batches) a batch without values_old takes them from that
forward's own values (stop_gradient), so advantages are computed inside the loss and no
separate old-values pass is needed; the result equals that of the two-pass path. The same
forward gives the learner's log-probs at the current params, hence the metric
`behaviour_logp_gap_max` (max |learner − sampler log-prob| over the response tokens of the
rows marked `fresh`).

Off-policy correction (`LearnerConfig.off_policy`, formulas in `rl.off_policy`): "none" takes
the PPO ratio against the sampler's old_logprobs; "decoupled" and "tis" take it against the
proximal log-probs (the learner's at the step's starting params: the single-pass forward under
stop_gradient, else batch["prox_logprobs"] or one forward before the first update) and multiply
each token's surrogate by the behaviour weight π_prox/π_behav (capped). Whenever the proximal
log-probs are at hand the step reports behaviour_weight_{mean,max,clipped_frac}.

Batch (see the contract in the helpers' brief): tokens, attention_mask, response_mask,
old_logprobs [B, T] (position t: log p(tokens[t] | tokens[<t]), at the sampling temperature),
rewards [B] (one score per episode), dt_s [B] (Δt, s), values_old [B, T] (critic), and
ref_logprobs [B, T] (KL), group_ids [B] (grpo/rloo) when the config needs them.
`compute_logprobs_and_values` produces old_logprobs/values_old/ref_logprobs in that alignment.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from rl4mle_jax import distributed, models
from rl4mle_jax import sharding as shd
from rl4mle_jax.rl import advantages as adv_lib
from rl4mle_jax.rl import critic as critic_lib
from rl4mle_jax.rl import duration, off_policy, ppo
from rl4mle_jax.rl.batch import Batch, prepare_batch, required_batch_keys, single_pass
from rl4mle_jax.rl.learner_config import LearnerConfig
from rl4mle_jax.rl.state import (
    TrainState,
    create_train_state,
    make_optimizer,
    make_schedule,
    opt_state_shardings,
)
from rl4mle_jax.sampling import truncate_logits, truncation_settings

# How per-micro-batch metrics combine into one number (default: token-weighted mean).
_SUMMED = ("loss", "pg_loss", "vf_loss", "actor_loss", "kl_loss", "entropy")  # already /full count
_MAXED = ("ratio_max", "behaviour_logp_gap_max", "behaviour_weight_max")
_MINNED = ("ratio_min",)
_NEG_INF = -jnp.inf


def shift_right(x_bt: jax.Array) -> jax.Array:
    """x[:, t-1] at position t, 0 at t = 0: a per-position output of the model aligned with
    the token it predicts (the state before token t)."""
    return jnp.pad(x_bt[:, :-1], ((0, 0), (1, 0)))


def truncated_log_softmax(logits_btv: jax.Array, targets_bt: jax.Array, top_k: int = 0,
                          top_p: float = 1.0, min_p: float = 0.0) -> jax.Array:
    """Log-probs [B, T, V] of the sampler's truncated distribution (`sampling.truncate_logits`
    of these logits, renormalised; cut tokens -inf), always keeping targets_bt [B, T], the token
    each position holds. The set carries no gradient. Shared by the train step and the analyses
    that must read the distribution it trains (scripts/analyse_entropy_positions.py)."""
    x = logits_btv.astype(jnp.float32)
    if top_k > 0 or top_p < 1 or min_p > 0:
        cut = truncate_logits(jax.lax.stop_gradient(x), top_k, top_p, top_p < 1, min_p)
        is_target = jnp.arange(x.shape[-1]) == targets_bt[..., None]  # fused, never materialised
        x = jnp.where(is_target | (cut > _NEG_INF), x, _NEG_INF)
    return jax.nn.log_softmax(x, axis=-1)


def token_logprobs_and_entropy(logits_btv: jax.Array, tokens_bt: jax.Array, start: int = 0,
                               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                               entropy_gate: float = 0.0, with_top: bool = False
                               ) -> tuple[jax.Array, ...]:
    """log p(tokens[t] | tokens[<t]) and that distribution's entropy, both [B, T] (0 at
    t <= start). logits_btv holds positions [start, T) (`logits_from`=start), divided by the
    sampling temperature.

    top_k / top_p / min_p: the sampler's truncation (`sampling.truncate_logits`); the
    distribution is then the truncated one, renormalised, as the sampler's log-probs are. The
    set is taken from these logits (no gradient flows through it) and always keeps the token
    the row holds: it was drawn from the behaviour set, and after an update its probability may
    fall below the floor, where its log-prob would be -inf (ratio 0, NaN gradients).

    entropy_gate > 0: the entropy's gradient flows only at positions whose most likely token
    has probability >= entropy_gate (`LearnerConfig.entropy_gate`); its value is unchanged.

    with_top: also [B, T] bool, whether the token the row holds is the distribution's most
    likely one (no gradient; False at t <= start).
    """
    targets = tokens_bt[:, start + 1:]
    logp_btv = truncated_log_softmax(logits_btv[:, :-1], targets, top_k, top_p, min_p)
    logp_bt = jnp.take_along_axis(logp_btv, targets[..., None], axis=-1)[..., 0]
    p_btv = jnp.exp(logp_btv)
    # 0 * -inf is NaN: cut tokens add 0 (and no NaN reaches the backward pass either).
    entropy_bt = -jnp.sum(p_btv * jnp.where(p_btv > 0, logp_btv, 0.0), axis=-1)
    if entropy_gate > 0 or with_top:
        top_logp = jax.lax.stop_gradient(jnp.max(logp_btv, axis=-1))
    if entropy_gate > 0:
        confident = top_logp >= math.log(entropy_gate)
        entropy_bt = jnp.where(confident, entropy_bt, jax.lax.stop_gradient(entropy_bt))
    pad = ((0, 0), (start + 1, 0))
    out = jnp.pad(logp_bt, pad), jnp.pad(entropy_bt, pad)
    if with_top:
        out += (jnp.pad(jax.lax.stop_gradient(logp_bt) >= top_logp, pad),)
    return out


def entropy_agrees(advantages_bt: jax.Array, held_top_bt: jax.Array) -> jax.Array:
    """[B, T] bool: where minimising the entropy moves probability the way the policy gradient
    does (`LearnerConfig.entropy_agree`). Sharpening moves mass to the most likely token; the
    policy gradient raises the held token where the advantage is >= 0 and lowers it where < 0.
    They agree where (advantage >= 0) == (the held token is the most likely one)."""
    return (advantages_bt >= 0) == held_top_bt


LOGITS_ALIGN = 8  # logits_start rounds down to a multiple of this (fewer distinct compiles)


def logits_start(response_mask_bt: Any) -> int:
    """The first position whose logits a batch's loss reads: the one before its earliest
    response token, rounded down to a multiple of LOGITS_ALIGN (0 where the mask is not on this
    host). Positions before it only predict prompt tokens, which no loss term counts; the
    loop's batches start every response at column P, so the step skips the unembedding and
    softmax of ~P of its P + R positions."""
    if isinstance(response_mask_bt, jax.Array) and not response_mask_bt.is_fully_addressable:
        return 0
    cols = np.flatnonzero(np.asarray(response_mask_bt).any(axis=0))
    if cols.size == 0:
        return 0
    start = max(int(cols[0]) - 1, 0)
    return start - start % LOGITS_ALIGN


def _combine(metrics: dict[str, jax.Array], weights: jax.Array) -> dict[str, jax.Array]:
    """Reduce stacked per-micro-batch metrics [N] to scalars."""
    out = {}
    for k, v in metrics.items():
        if k in _SUMMED:
            out[k] = jnp.sum(v)
        elif k in _MAXED:
            out[k] = jnp.max(v)
        elif k in _MINNED:
            out[k] = jnp.min(v)
        else:
            out[k] = jnp.sum(v * weights)
    return out


class Learner:
    """Shardings, optimizers and the jitted functions of the PPO learner.

    Attributes: `train_step` (validating wrapper around `train_step_jit`), `init_state`,
    `compute_logprobs_and_values`, `compute_logprobs` (for the frozen reference),
    `shard_params`, `abstract_state`.
    """

    def __init__(self, model_config: models.Qwen2Config, config: LearnerConfig, mesh: Mesh,
                 rules: shd.Rules = shd.DEFAULT_RULES):
        self.model_config, self.config, self.mesh, self.rules = model_config, config, mesh, rules
        cfg = config
        self.updates_per_step = cfg.ppo_epochs * cfg.num_minibatches

        def opt(lr: float) -> tuple[optax.GradientTransformation, optax.Schedule]:
            schedule = make_schedule(lr, cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule,
                                     cfg.min_lr_ratio)
            return make_optimizer(schedule, max_grad_norm=cfg.max_grad_norm, b1=cfg.adam_b1,
                                  b2=cfg.adam_b2, eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay), schedule

        self.actor_opt, self.actor_schedule = opt(cfg.actor_lr)
        self.critic_opt, self.critic_schedule = opt(cfg.critic_lr)
        self.entropy_schedule = ppo.entropy_coef_schedule(
            cfg.entropy_coef, cfg.entropy_coef_end, cfg.entropy_decay_steps, cfg.entropy_schedule)

        # Shardings from logical names, computed once.
        repl = shd.replicated(mesh)
        self.batch_sharding = shd.batch_sharding(mesh, rules)
        key = jax.random.PRNGKey(0)
        abstract_policy = jax.eval_shape(lambda k: models.init_params(model_config, k), key)
        self.policy_shardings = shd.logical_to_sharding(
            models.param_logical_axes(model_config), mesh, rules, abstract_policy)
        abstract_critic = jax.eval_shape(self._init_critic, abstract_policy, key)
        self.critic_shardings = shd.logical_to_sharding(self._critic_axes(), mesh, rules,
                                                        abstract_critic)
        self.state_shardings = TrainState(
            step=repl, policy_params=self.policy_shardings, critic_params=self.critic_shardings,
            actor_opt_state=opt_state_shardings(self.actor_opt, abstract_policy,
                                                self.policy_shardings, repl),
            critic_opt_state=opt_state_shardings(self.critic_opt, abstract_critic,
                                                 self.critic_shardings, repl),
            rng=repl)

        self.init_state = jax.jit(self._init_state_impl,
                                  in_shardings=(self.policy_shardings, repl),
                                  out_shardings=self.state_shardings)
        # Third argument, logits_from (static): where the loss's logits start (logits_start).
        self.train_step_jit = jax.jit(self._train_step_impl,
                                      in_shardings=(self.state_shardings, self.batch_sharding),
                                      out_shardings=(self.state_shardings, repl),
                                      donate_argnums=0, static_argnums=2)
        bs = self.batch_sharding
        self.compute_logprobs_and_values = jax.jit(
            self._logprobs_and_values_impl,
            in_shardings=(self.policy_shardings, self.critic_shardings, bs, bs),
            out_shardings=bs)
        self.compute_logprobs = jax.jit(self._logprobs_impl,
                                        in_shardings=(self.policy_shardings, bs, bs),
                                        out_shardings=bs)

    # ----------------------------------------------------------------------- parameters
    def _init_critic(self, policy_params: Any, rng: jax.Array) -> Any:
        if not self.config.uses_critic:
            return {}
        return critic_lib.init_critic(self.model_config, policy_params, rng,
                                      shared_trunk=self.config.critic == "shared")

    def _critic_axes(self) -> Any:
        if not self.config.uses_critic:
            return {}
        return critic_lib.critic_logical_axes(self.model_config,
                                              shared_trunk=self.config.critic == "shared")

    def _init_state_impl(self, policy_params: Any, rng: jax.Array) -> TrainState:
        k_critic, k_state = jax.random.split(rng)
        policy = jax.tree.map(jnp.copy, policy_params)  # own buffers (the state is donated)
        return create_train_state(policy, self._init_critic(policy_params, k_critic),
                                  self.actor_opt, self.critic_opt, k_state)

    def shard_params(self, params: Any) -> Any:
        """Policy-shaped params (e.g. the frozen reference) placed with the policy shardings."""
        return jax.device_put(params, self.policy_shardings)

    def abstract_state(self) -> TrainState:
        """ShapeDtypeStructs with shardings of the state (for checkpoint restore)."""
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        abstract_policy = jax.eval_shape(lambda k: models.init_params(self.model_config, k), key)
        shapes = jax.eval_shape(self._init_state_impl, abstract_policy, key)
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                            shapes, self.state_shardings)

    # ------------------------------------------------------------------ model passes
    def _model_outputs(self, policy: Any, critic: Any, tokens_bt: jax.Array,
                       attention_mask_bt: jax.Array, logits_from: int = 0
                       ) -> tuple[jax.Array, jax.Array | None]:
        """(logits / temperature [B, T - logits_from, V], values aligned like log-probs [B, T]
        or None)."""
        mc, mode = self.model_config, self.config.critic
        kw = {"remat": self.config.remat, "attention_chunk": self.config.attention_chunk}
        if mode == "shared":
            logits, values = critic_lib.logits_and_shared_values(
                mc, policy, critic["value_head"], tokens_bt, attention_mask_bt,
                logits_from=logits_from, **kw)
        else:
            logits = critic_lib.policy_logits(mc, policy, tokens_bt, attention_mask_bt,
                                              logits_from=logits_from, **kw)
            values = (critic_lib.critic_values(mc, critic, tokens_bt, attention_mask_bt, **kw)
                      if mode == "separate" else None)
        values = None if values is None else shift_right(values)
        return logits / self.config.temperature, values

    @property
    def _truncation(self) -> dict[str, Any]:
        """The sampler's truncation, as `token_logprobs_and_entropy` takes it."""
        return truncation_settings(self.config)

    def _chunked(self, fn, *arrays: jax.Array):
        """fn over rows in chunks of micro_batch_size (bounds the [B, T, V] logits)."""
        mbs, b = self.config.micro_batch_size, arrays[0].shape[0]
        if not mbs or mbs >= b or b % mbs:
            return fn(*arrays)
        split = [a.reshape(b // mbs, mbs, *a.shape[1:]) for a in arrays]
        out = jax.lax.map(lambda xs: fn(*xs), tuple(split))
        return jax.tree.map(lambda x: x.reshape(b, *x.shape[2:]), out)

    def _logprobs_and_values_impl(self, policy: Any, critic: Any, tokens_bt: jax.Array,
                                  attention_mask_bt: jax.Array) -> dict[str, jax.Array]:
        def fn(tokens, mask):
            logits, values = self._model_outputs(policy, critic, tokens, mask)
            logp, ent = token_logprobs_and_entropy(logits, tokens, **self._truncation)
            return {"logprobs": logp, "entropy": ent,
                    "values": jnp.zeros_like(logp) if values is None else values}
        return self._chunked(fn, tokens_bt, attention_mask_bt)

    def _logprobs_impl(self, params: Any, tokens_bt: jax.Array,
                       attention_mask_bt: jax.Array) -> jax.Array:
        def fn(tokens, mask):
            logits = critic_lib.policy_logits(self.model_config, params, tokens, mask,
                                              attention_chunk=self.config.attention_chunk)
            return token_logprobs_and_entropy(logits / self.config.temperature, tokens,
                                              **self._truncation)[0]
        return self._chunked(fn, tokens_bt, attention_mask_bt)

    # --------------------------------------------------------------------- the update
    def _advantages(self, x: Batch, values_bt: jax.Array | None) -> adv_lib.Advantages:
        cfg = self.config
        advs = adv_lib.compute_advantages(
            cfg.advantage_estimator, x["rewards"].astype(jnp.float32), x["mask"],
            values_bt=values_bt, kl_bt=x.get("kl_ref") if cfg.kl_mode == "reward" else None,
            kl_coef=cfg.kl_coef, group_ids_b=x.get("group_ids"), gamma=cfg.gamma, lam=cfg.lam,
            whiten_advantages=cfg.whiten_advantages, zero_flat=cfg.zero_flat_batches)
        if cfg.failure_credit != "sequence":
            # The advantages as computed (whitened over every response token), then only the
            # credited tokens keep theirs: the others add nothing to the policy gradient but
            # still count in the token-mean's denominator; the critic's returns are unchanged.
            advs = advs._replace(advantages_bt=advs.advantages_bt * x["credit_mask"])
        return advs

    def _loss(self, policy, critic, x, normalizer, entropy_coef, logits_from=0):
        cfg = self.config
        logits, values = self._model_outputs(policy, critic, x["tokens"], x["attention_mask"],
                                             logits_from)
        logp, entropy, *held_top = token_logprobs_and_entropy(
            logits, x["tokens"], logits_from, entropy_gate=cfg.entropy_gate,
            with_top=cfg.entropy_agree, **self._truncation)
        step_metrics = {}
        if "advantages" not in x:  # single pass: the old values are this forward's values
            values_old = jax.lax.stop_gradient(values)
            advs = self._advantages(x, values_old)
            x = {**x, "values_old": values_old, "advantages": advs.advantages_bt,
                 "returns": advs.returns_bt}
            step_metrics = {"advantages_mean": ppo.masked_mean(advs.advantages_bt, x["mask"]),
                            "returns_mean": ppo.masked_mean(advs.returns_bt, x["mask"]),
                            "values_old_mean": ppo.masked_mean(values_old, x["mask"])}
        if "fresh" in x:  # single pass: logp is at the params the fresh rows were sampled with
            gap = jnp.abs(jax.lax.stop_gradient(logp) - x["old_logprobs"])
            step_metrics["behaviour_logp_gap_max"] = jnp.max(gap * x["mask"]
                                                             * x["fresh"][:, None])
        # π_prox: fixed before the first of several updates, or (single pass, marked by
        # "fresh") this forward, which runs at the step's starting params.
        prox = x.get("prox_logprobs")
        if prox is None and "fresh" in x:
            prox = jax.lax.stop_gradient(logp)
        ratio_against, token_weights = x["old_logprobs"], None
        if prox is not None:
            w_bt, w_metrics = off_policy.behaviour_weights(
                prox, x["old_logprobs"], x["mask"], cfg.off_policy, cfg.off_policy_cap)
            step_metrics.update(w_metrics)
            if cfg.off_policy != "none":
                ratio_against, token_weights = prox, w_bt
        if cfg.entropy_coef == 0 and cfg.entropy_coef_end == 0:
            entropy = jax.lax.stop_gradient(entropy)  # a metric only: skip its backward pass
        elif held_top:  # learner.entropy_agree: sharpen only where the policy gradient agrees
            # (elsewhere the gradient weighs entropy_disagree: 0 none, -1 reversed; the value
            # is unchanged either way)
            w = cfg.entropy_disagree
            entropy = jnp.where(entropy_agrees(x["advantages"], held_top[0]), entropy,
                                w * entropy + (1 - w) * jax.lax.stop_gradient(entropy))
        in_loss_kl = cfg.uses_ref and cfg.kl_mode == "loss"
        loss, metrics = ppo.actor_loss(
            logp, ratio_against, x["advantages"], x["mask"], token_weights_bt=token_weights,
            sample_weights_b=x["weights"], entropy_bt=entropy, entropy_coef=entropy_coef,
            ref_logprobs_bt=x["ref_logprobs"] if in_loss_kl else None, kl_coef=cfg.kl_coef,
            kl_kind=cfg.kl_estimator, agg_mode=cfg.agg_mode, normalizer=normalizer,
            clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high, dual_clip_c=cfg.dual_clip_c,
            pg_coef=cfg.pg_coef)
        if values is not None:
            v_loss, v_metrics = ppo.value_loss(
                values, x["values_old"], x["returns"], x["mask"], clip_eps=cfg.value_clip_eps,
                agg_mode=cfg.agg_mode, normalizer=normalizer)
            loss = loss + (cfg.vf_coef if cfg.critic == "shared" else 1.0) * v_loss
            metrics.update(v_metrics)
        metrics.update(step_metrics)
        return loss, metrics

    def _minibatch_grads(self, policy, critic, mb, entropy_coef, logits_from=0):
        """Gradients of the minibatch loss, accumulated over micro-batches (leading axis of mb)."""
        mask_all = mb["mask"].reshape(-1, mb["mask"].shape[-1])
        normalizer = ppo.aggregation_normalizer(mask_all, self.config.agg_mode)
        n_tokens = jnp.maximum(jnp.sum(mask_all), 1.0)
        grad_fn = jax.value_and_grad(self._loss, argnums=(0, 1), has_aux=True)
        f32 = lambda t: jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), t)

        # Pin each micro-batch to the batch axes when it splits evenly over them.
        constrain = mb["tokens"].shape[1] % shd.batch_divisor(self.mesh, self.rules) == 0

        def micro(acc, x):
            if constrain:
                x = jax.tree.map(lambda a: shd.with_batch_constraint(a, self.mesh, self.rules), x)
            (loss, metrics), (g_pol, g_crit) = grad_fn(policy, critic, x, normalizer,
                                                       entropy_coef, logits_from=logits_from)
            acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, (g_pol, g_crit))
            metrics["loss"] = loss
            return acc, (metrics, jnp.sum(x["mask"]) / n_tokens)

        (g_pol, g_crit), (metrics, weights) = jax.lax.scan(micro, (f32(policy), f32(critic)), mb)
        metrics = _combine(metrics, weights)
        cast = lambda g, p: jax.tree.map(lambda a, q: a.astype(q.dtype), g, p)
        return cast(g_pol, policy), cast(g_crit, critic), metrics

    def _train_step_impl(self, state: TrainState, batch: Batch, logits_from: int = 0
                         ) -> tuple[TrainState, dict]:
        cfg = self.config
        tokens = batch["tokens"]
        b, t = tokens.shape
        mask = (batch["response_mask"] * batch["attention_mask"]).astype(jnp.float32)
        valid_b = jnp.sum(mask, axis=1) > 0
        old_logprobs = batch["old_logprobs"].astype(jnp.float32)

        one_pass = single_pass(cfg)
        values_in_step = cfg.uses_critic and "values_old" not in batch
        if values_in_step and not one_pass:
            raise ValueError("batch has no 'values_old': only a single-pass step (ppo_epochs=1, "
                             "num_minibatches=1, micro_batch_size=0) computes them itself")

        kl_ref = None
        if cfg.uses_ref:
            kl_ref = ppo.kl_penalty(old_logprobs, batch["ref_logprobs"], cfg.kl_estimator)
        weights_b = duration.duration_weights(batch["dt_s"], cfg.duration_weighting,
                                              valid_b=valid_b, max_weight=cfg.duration_max_weight,
                                              inclusion_b=batch.get("inclusion"))
        rows = {"tokens": tokens, "attention_mask": batch["attention_mask"], "mask": mask,
                "old_logprobs": old_logprobs, "weights": weights_b,
                "rewards": batch["rewards"].astype(jnp.float32)}
        if not one_pass and cfg.off_policy != "none" and "prox_logprobs" not in batch:
            rows["prox_logprobs"] = jax.lax.stop_gradient(self._logprobs_impl(
                state.policy_params, tokens, batch["attention_mask"]))
        for k in ("ref_logprobs", "values_old", "group_ids", "prox_logprobs", "credit_mask"):
            if k in batch:
                rows[k] = batch[k] if k == "group_ids" else batch[k].astype(jnp.float32)
        if kl_ref is not None:
            rows["kl_ref"] = kl_ref
        if one_pass:
            rows["fresh"] = batch["fresh"].astype(jnp.float32) if "fresh" in batch else (
                jnp.ones((b,), jnp.float32))
        advs = None
        if not values_in_step:  # else the loss computes them from its forward's values
            advs = self._advantages(rows, rows["values_old"] if cfg.uses_critic else None)
            rows["advantages"], rows["returns"] = advs.advantages_bt, advs.returns_bt

        # Row indices of every (update, micro-batch): [U, n_micro, micro_bs].
        n_mb = b // cfg.num_minibatches
        micro_bs = cfg.micro_batch_size or n_mb
        rng, k_perm = jax.random.split(state.rng)
        if cfg.shuffle:
            perms = jax.vmap(lambda k: jax.random.permutation(k, b))(
                jax.random.split(k_perm, cfg.ppo_epochs))
        else:
            perms = jnp.tile(jnp.arange(b), (cfg.ppo_epochs, 1))
        idx = perms.reshape(self.updates_per_step, n_mb // micro_bs, micro_bs)
        entropy_coef = self.entropy_schedule(state.step)

        def update(carry, idx_nm):
            policy, critic, a_opt, c_opt = carry
            mb = jax.tree.map(lambda x: x[idx_nm], rows)
            g_pol, g_crit, metrics = self._minibatch_grads(policy, critic, mb, entropy_coef,
                                                           logits_from)
            metrics["grad_norm_actor"] = optax.tree.norm(g_pol)
            upd, a_opt = self.actor_opt.update(g_pol, a_opt, policy)
            policy = optax.apply_updates(policy, upd)
            if cfg.uses_critic:
                metrics["grad_norm_critic"] = optax.tree.norm(g_crit)
                upd, c_opt = self.critic_opt.update(g_crit, c_opt, critic)
                critic = optax.apply_updates(critic, upd)
            return (policy, critic, a_opt, c_opt), metrics

        carry = (state.policy_params, state.critic_params, state.actor_opt_state,
                 state.critic_opt_state)
        (policy, critic, a_opt, c_opt), metrics = jax.lax.scan(update, carry, idx)
        u = self.updates_per_step
        metrics = _combine(metrics, jnp.full((u,), 1.0 / u))
        metrics = {k: (v / u if k in _SUMMED else v) for k, v in metrics.items()}

        n_valid = jnp.maximum(jnp.sum(valid_b), 1)
        last_update = state.step * u + u - 1
        metrics.update({
            "lr_actor": self.actor_schedule(last_update),
            "lr_critic": self.critic_schedule(last_update),
            "reward_mean": jnp.sum(batch["rewards"] * valid_b) / n_valid,
            "response_length_mean": jnp.sum(mask) / n_valid,
            "duration_weight_max": jnp.max(weights_b),
            "dt_s/mean": jnp.sum(batch["dt_s"] * valid_b) / n_valid,
        })
        if kl_ref is not None:
            metrics["kl_ref_behaviour"] = ppo.masked_mean(kl_ref, mask)
        if cfg.failure_credit != "sequence":  # the response tokens left without an advantage
            metrics["credit_masked_frac"] = 1.0 - ppo.masked_mean(batch["credit_mask"], mask)
        if advs is not None:
            metrics["advantages_mean"] = ppo.masked_mean(advs.advantages_bt, mask)
            metrics["returns_mean"] = ppo.masked_mean(advs.returns_bt, mask)
        if cfg.uses_critic and not values_in_step:
            metrics["values_old_mean"] = ppo.masked_mean(batch["values_old"], mask)
        new_state = state.replace(step=state.step + 1, policy_params=policy, critic_params=critic,
                                  actor_opt_state=a_opt, critic_opt_state=c_opt, rng=rng)
        return new_state, metrics

    # -------------------------------------------------------------------- host side
    def required_keys(self) -> tuple[str, ...]:
        return required_batch_keys(self.config)

    def prepare_batch(self, batch: Batch) -> Batch:
        """The batch checked against the contract, with exactly the keys the step uses."""
        return prepare_batch(batch, self.config, shd.batch_divisor(self.mesh, self.rules),
                             self.model_config.vocab_size)

    def step_inputs(self, batch: Batch) -> tuple[Batch, int]:
        """`train_step_jit`'s batch and logits_from for `batch`: checked, placed on the batch
        sharding, the logits starting where its responses do (`logits_start`)."""
        batch = self.prepare_batch(batch)
        start = logits_start(batch["response_mask"])
        return distributed.to_global(batch, self.batch_sharding), start

    def train_step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        """Validated `train_step_jit` (the state is donated: do not reuse the argument)."""
        return self.train_step_jit(state, *self.step_inputs(batch))

    def compile_train_step(self, batch: Batch) -> None:
        """Compiles `train_step` for this batch's keys, shapes, dtypes and placement ahead of
        its first call (the values are not used and the live state is not touched: it is taken
        abstractly), so that call finds the executable in JAX's cache and compiles nothing.
        Give each leaf as the call will: host arrays as host arrays, device outputs (e.g.
        values_old from `compute_logprobs_and_values`) as device arrays with their sharding.
        Safe from another thread while the state trains."""
        self.train_step_jit.lower(self.abstract_state(), *self.step_inputs(batch)).compile()

    def run_once(self, state: TrainState, batch: Batch) -> None:
        """Executes `train_step` once on a copy of `state` (the copy is donated and dropped;
        `state` is untouched). On CPU the first execution at a batch shape touches its
        temporaries' memory for the first time: measured here at the default run's largest
        shape, 1.7 M page faults and 20 s for a 6 s step; an allocator that keeps freed memory
        (tcmalloc, rl4mle_jax/allocator.py) lets later steps reuse those pages, so one
        execution before the RL clock takes that cost out of it."""
        copy = jax.tree.map(jnp.copy, state)
        _, metrics = self.train_step(copy, batch)
        jax.block_until_ready(metrics)


def make_learner(model_config: models.Qwen2Config, ppo_config: LearnerConfig | Any,
                 mesh: Mesh, rules: shd.Rules = shd.DEFAULT_RULES) -> Learner:
    """A Learner; `ppo_config` may be a LearnerConfig or a dict/ConfigDict of its fields."""
    if not isinstance(ppo_config, LearnerConfig):
        ppo_config = LearnerConfig.from_dict(ppo_config)
    return Learner(model_config, ppo_config, mesh, rules)


def make_train_step(model_config: models.Qwen2Config, ppo_config: LearnerConfig | Any,
                    mesh: Mesh, rules: shd.Rules = shd.DEFAULT_RULES):
    """The validated, jitted `train_step(state, batch) -> (state, metrics)` of a new Learner."""
    return make_learner(model_config, ppo_config, mesh, rules).train_step
