"""Off-policy correction for stale samples: the per-token behaviour weight π_prox/π_behav.

Three policies score each response token:
- π_behav, the sampler's, recorded when the token was sampled (batch["old_logprobs"]), possibly
  several parameter versions ago;
- π_prox, the "proximal" policy: the learner's at the params the train step starts from (in a
  single-pass step the step's own forward, under stop_gradient; with several updates one
  forward before the first, or batch["prox_logprobs"]);
- π_θ, the policy being optimised.

With w = π_prox/π_behav (no gradient through it), r_b = π_θ/π_behav, r_p = π_θ/π_prox and
ℓ(r) = max(−A·r, −A·clip(r, 1−ε, 1+ε_high)) (with the dual clip of `rl.ppo.policy_loss`), the
per-token policy loss of each `LearnerConfig.off_policy` mode is

    none       ℓ_t = ℓ(r_b)                    PPO (Schulman et al. 2017), trust region at π_behav
    decoupled  ℓ_t = w·1[w ≤ C]·ℓ(r_p)         decoupled PPO (Hilton et al. 2021, "Batch size-
                                               invariance for policy optimization"), with
                                               AReaL's cap (Fu et al. 2025: tokens with w > C are
                                               left out; C = None keeps every token)
    tis        ℓ_t = min(w, C)·ℓ(r_p)          truncated importance sampling (Ionides 2008; the
                                               ρ̄ of IMPALA, Espeholt et al. 2018; for LLM RL Yao
                                               et al. 2025, "Your efficient RL framework secretly
                                               brings you off-policy RL training")

Why the clip is against π_prox in both corrected modes: at θ = θ_prox, r_p = 1 lies inside
the clip range, so ∇ℓ_t = −w̄·A·∇log π_θ (w̄ the applied weight): the importance-sampled
policy gradient for tokens drawn from π_behav (exact for decoupled, truncated for tis), while
further updates stay within ε of π_prox, which is close to π_θ whatever the staleness. Today's
ℓ(r_b) multiplied by w would count the staleness twice (r_b = w·r_p already carries it).
When every sample is fresh, π_behav = π_prox, w = 1 and r_p = r_b: all modes give one update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl4mle_jax.rl.learner_config import OFF_POLICY_MODES

Metrics = dict[str, jax.Array]


def behaviour_weights(
    prox_logprobs_bt: jax.Array,
    behaviour_logprobs_bt: jax.Array,
    response_mask_bt: jax.Array,
    mode: str,
    cap: float | None,
    log_ratio_clip: float = 20.0,
) -> tuple[jax.Array, Metrics]:
    """The weight [B, T] each token's PPO surrogate is multiplied by, and its metrics.

    w = exp(clip(log π_prox − log π_behav, ±log_ratio_clip)) under stop_gradient; applied:
    1 (none), w·1[w ≤ C] (decoupled), min(w, C) (tis); 0 off the response mask.
    Metrics (over response tokens, of the raw w): behaviour_weight_mean, behaviour_weight_max,
    and behaviour_weight_clipped_frac, the fraction with w > C (left out by decoupled,
    truncated by tis, only reported by none; 0 when C is None).
    """
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"off_policy mode {mode!r} is not one of {OFF_POLICY_MODES}")
    if mode == "tis" and cap is None:
        raise ValueError("off_policy='tis' needs a cap")
    mask = response_mask_bt.astype(jnp.float32)
    log_w = jnp.clip(prox_logprobs_bt.astype(jnp.float32)
                     - behaviour_logprobs_bt.astype(jnp.float32), -log_ratio_clip, log_ratio_clip)
    w = jax.lax.stop_gradient(jnp.exp(log_w))
    above = jnp.zeros_like(w, bool) if cap is None else w > cap
    if mode == "none":
        applied = jnp.ones_like(w)
    elif mode == "decoupled":
        applied = jnp.where(above, 0.0, w)
    else:
        applied = jnp.minimum(w, cap)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    has_tokens = jnp.sum(mask) > 0
    metrics = {
        "behaviour_weight_mean": jnp.sum(w * mask) / n,
        "behaviour_weight_max": jnp.where(has_tokens, jnp.max(jnp.where(mask > 0, w, -jnp.inf)),
                                          1.0),
        "behaviour_weight_clipped_frac": jnp.sum(above * mask) / n,
    }
    return applied * mask, metrics
