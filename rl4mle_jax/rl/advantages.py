"""Advantage estimators over [B, T] token arrays: GAE (default) and group baselines (GRPO, RLOO).

Layout: prompt + response in one row, prompt left padded, response right padded;
`response_mask_bt` is 1 on response tokens. Each episode has one scalar score, placed at its
last response token (`token_rewards`), optionally with a per-token KL penalty (KL in reward).
Compute advantages once on the whole batch, before any micro-batching: whitening and group
statistics are batch-level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np


class Advantages(NamedTuple):
    advantages_bt: jax.Array  # 0 outside the response mask
    returns_bt: jax.Array  # critic targets; 0 outside the response mask


def _check_mask(response_mask_bt: jax.Array, **others: jax.Array | None) -> None:
    chex.assert_rank(response_mask_bt, 2, custom_message="response_mask_bt must be [B, T]")
    for name, x in others.items():
        if x is None:
            continue
        if name.endswith("_b"):
            chex.assert_shape(x, response_mask_bt.shape[:1], custom_message=f"{name} must be [B]")
        else:
            chex.assert_shape(x, response_mask_bt.shape,
                              custom_message=f"{name} must match response_mask_bt")


def last_token_onehot(response_mask_bt: jax.Array) -> jax.Array:
    """[B, T] float32 one-hot of the last response token of each row (all zero if none)."""
    mask = response_mask_bt.astype(jnp.float32)
    t = mask.shape[1]
    last_b = t - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    return jax.nn.one_hot(last_b, t, dtype=jnp.float32) * (jnp.sum(mask, axis=1) > 0)[:, None]


def token_rewards(
    scores_b: jax.Array,
    response_mask_bt: jax.Array,
    kl_bt: jax.Array | None = None,
    kl_coef: float = 0.0,
) -> jax.Array:
    """Token rewards [B, T]: score at the last response token, minus kl_coef·KL on each token."""
    _check_mask(response_mask_bt, scores_b=scores_b, kl_bt=kl_bt)
    rewards = last_token_onehot(response_mask_bt) * scores_b.astype(jnp.float32)[:, None]
    if kl_bt is not None:
        rewards = rewards - kl_coef * kl_bt.astype(jnp.float32) * response_mask_bt
    return rewards


def gae(
    token_rewards_bt: jax.Array,
    values_bt: jax.Array,
    response_mask_bt: jax.Array,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> Advantages:
    """GAE by a reverse scan over time; masked positions pass the carry through unchanged.

    Schulman et al. 2016 ("High-Dimensional Continuous Control Using Generalized Advantage
    Estimation"), eq. 16; γ = λ = 1 by default, so A_t = R − V_t for the one terminal reward.

    δ_t = r_t + γ V_next − V_t,  A_t = δ_t + γλ A_next, where "next" is the next response
    token of the row (V_next = A_next = 0 after the last one). Returns = A + V.
    """
    _check_mask(response_mask_bt, token_rewards_bt=token_rewards_bt, values_bt=values_bt)
    mask_tb = response_mask_bt.astype(jnp.float32).T
    rewards_tb = token_rewards_bt.astype(jnp.float32).T
    values_tb = values_bt.astype(jnp.float32).T

    def step(carry, xs):
        next_value, next_adv = carry  # [B], [B]
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        carry = (m * v + (1.0 - m) * next_value, m * adv + (1.0 - m) * next_adv)
        return carry, adv * m

    zeros = jnp.zeros(mask_tb.shape[1], jnp.float32)
    _, adv_tb = jax.lax.scan(step, (zeros, zeros), (rewards_tb, values_tb, mask_tb), reverse=True)
    adv_bt = adv_tb.T
    return Advantages(adv_bt, (adv_bt + values_tb.T) * mask_tb.T)


def whiten(
    x_bt: jax.Array, mask_bt: jax.Array, shift_mean: bool = True, eps: float = 1e-8
) -> jax.Array:
    """(x − mean)/sqrt(var + eps) over the masked entries of the whole batch; 0 outside the mask.

    var is the unbiased (n − 1) masked variance, as verl computes it.
    """
    chex.assert_equal_shape([x_bt, mask_bt], custom_message="x_bt vs mask_bt")
    mask = mask_bt.astype(jnp.float32)
    n = jnp.sum(mask)
    mean = jnp.sum(x_bt * mask) / jnp.maximum(n, 1.0)
    var = jnp.sum(jnp.square(x_bt - mean) * mask) / jnp.maximum(n - 1.0, 1.0)
    out = (x_bt - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def _group_stats(
    scores_b: jax.Array, group_ids_b: jax.Array | None, valid_b: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row group sum, count and unbiased std of the scores (over valid rows only)."""
    if group_ids_b is None:
        group_ids_b = jnp.zeros(scores_b.shape, jnp.int32)
    same_bb = (group_ids_b[:, None] == group_ids_b[None, :]) * valid_b[None, :]
    count_b = jnp.sum(same_bb, axis=1)
    sum_b = same_bb @ scores_b
    mean_b = sum_b / jnp.maximum(count_b, 1.0)
    sq_b = jnp.sum(same_bb * jnp.square(scores_b[None, :] - mean_b[:, None]), axis=1)
    std_b = jnp.sqrt(sq_b / jnp.maximum(count_b - 1.0, 1.0))
    return sum_b, count_b, std_b


def group_advantages(
    scores_b: jax.Array,
    valid_b: jax.Array,
    group_ids_b: jax.Array | None = None,
    method: str = "grpo",
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> jax.Array:
    """Per-episode advantages [B] from a group baseline; groups of one get advantage 0.

    "grpo": (s − mean_group) / std_group (Shao et al. 2024, DeepSeekMath); "rloo": s minus the
    mean of the other members (Ahmadian et al. 2024).

    grpo: (r − mean_group)/(std_group + eps) (std unbiased; normalize_std=False skips it);
    rloo: r − mean of the other members of the group.
    group_ids_b None: the whole batch is one group.
    """
    chex.assert_rank(scores_b, 1, custom_message="scores_b must be [B]")
    scores = scores_b.astype(jnp.float32)
    valid = valid_b.astype(jnp.float32)
    sum_b, count_b, std_b = _group_stats(scores, group_ids_b, valid)
    if method == "grpo":
        adv = scores - sum_b / jnp.maximum(count_b, 1.0)
        if normalize_std:
            adv = adv / (std_b + eps)
    elif method == "rloo":
        adv = scores - (sum_b - scores) / jnp.maximum(count_b - 1.0, 1.0)
    else:
        raise ValueError(f"group baseline {method!r} is not one of ('grpo', 'rloo')")
    return jnp.where(count_b > 1, adv, 0.0) * valid


Estimator = Callable[..., Advantages]


def _gae_estimator(rewards_bt, response_mask_bt, values_bt, group_ids_b, gamma, lam):
    if values_bt is None:
        raise ValueError("advantage estimator 'gae' needs values_bt (the critic's values)")
    return gae(rewards_bt, values_bt, response_mask_bt, gamma, lam)


def _group_estimator(method: str) -> Estimator:
    def estimator(rewards_bt, response_mask_bt, values_bt, group_ids_b, gamma, lam):
        del values_bt, gamma, lam  # one-step credit: every token gets the episode's advantage
        mask = response_mask_bt.astype(jnp.float32)
        scores_b = jnp.sum(rewards_bt, axis=1)  # score minus the summed KL penalty, as verl
        adv_b = group_advantages(scores_b, jnp.sum(mask, axis=1) > 0, group_ids_b, method)
        return Advantages(adv_b[:, None] * mask, scores_b[:, None] * mask)

    return estimator


FLAT_TOL = 1e-6  # scores closer than this are equal (flat_scores)

# name -> (estimator, whiten the advantages over the batch by default)
ADVANTAGE_ESTIMATORS: dict[str, tuple[Estimator, bool]] = {
    "gae": (_gae_estimator, True),
    "grpo": (_group_estimator("grpo"), False),
    "rloo": (_group_estimator("rloo"), False),
}


def compute_advantages(
    estimator: str,
    scores_b: jax.Array,
    response_mask_bt: jax.Array,
    *,
    values_bt: jax.Array | None = None,
    kl_bt: jax.Array | None = None,
    kl_coef: float = 0.0,
    group_ids_b: jax.Array | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten_advantages: bool | None = None,
    zero_flat: bool = False,
) -> Advantages:
    """Token rewards → advantages and returns with the estimator registered under `estimator`.

    Args:
      kl_bt, kl_coef: per-token KL to the reference, subtracted from the token rewards.
      group_ids_b: int [B] group of each episode (e.g. its prompt) for grpo/rloo.
      whiten_advantages: None uses the estimator's default (gae: True, grpo/rloo: False).
      zero_flat: when every episode with a response has the same score (and no KL is in the
        reward) the batch says nothing about which actions are better: its advantages are set
        to 0 (the returns, the critic's targets, are kept). Whitened GAE advantages of such a
        batch are the critic's errors scaled up to unit variance, a full-size policy step on
        noise. (Group estimators already give 0 there.)
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {estimator!r} is not one of "
                         f"{tuple(ADVANTAGE_ESTIMATORS)}")
    _check_mask(response_mask_bt, scores_b=scores_b, values_bt=values_bt,
                group_ids_b=group_ids_b)
    fn, default_whiten = ADVANTAGE_ESTIMATORS[estimator]
    rewards_bt = token_rewards(scores_b, response_mask_bt, kl_bt, kl_coef)
    out = fn(rewards_bt, response_mask_bt, values_bt, group_ids_b, gamma, lam)
    if default_whiten if whiten_advantages is None else whiten_advantages:
        out = Advantages(whiten(out.advantages_bt, response_mask_bt), out.returns_bt)
    if zero_flat and (kl_bt is None or kl_coef == 0):
        out = Advantages(jnp.where(flat_scores(scores_b, response_mask_bt), 0.0,
                                   out.advantages_bt), out.returns_bt)
    return out


def flat_scores(scores_b: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """Whether every row with a response token has the same score (a bool scalar; True for a
    batch without responses)."""
    rows = jnp.any(response_mask_bt > 0, axis=1)
    scores = scores_b.astype(jnp.float32)
    hi = jnp.max(jnp.where(rows, scores, -jnp.inf))
    lo = jnp.min(jnp.where(rows, scores, jnp.inf))
    return jnp.logical_or(~jnp.any(rows), hi - lo <= FLAT_TOL)


# Fewest bootstrap replicates (finite in both rows) for a pair's standard error to count.
MIN_TIE_REPLICATES = 16


def valid_rank_bonus(scores_b: np.ndarray, valid_b: np.ndarray, coef: float,
                     group_ids_b: np.ndarray | None = None, boot_bk: np.ndarray | None = None,
                     tie_se: float = 0.0) -> np.ndarray:
    """coef × the centred rank of each valid row's score among its group's valid rows [B].

    Host side (numpy), added to a learner batch's rewards before it is sent
    (`run.rank_bonus`). A valid row's rank is the number of its group's other valid rows it
    beats, a pair it neither wins nor loses counting one half (so equal scores share their
    mean rank); the bonus is coef · (rank / (n − 1) − 1/2), in [−coef/2, coef/2] and summing to
    0 over a group's valid rows. Invalid rows, and groups with fewer than two valid rows, get 0.
    Higher score = better (pass the oriented score). group_ids_b None: one group.

    boot_bk [B, K] (with tie_se > 0): each row's score on K resamples shared by all rows
    (`env.grading.GradeReport.score_boot`, in the scale of scores_b; NaN where missing). A pair
    whose score difference is within tie_se × the standard deviation of their replicates'
    differences (the paired bootstrap's standard error) is a tie, not a win: the rank stops
    rewarding gaps the reward split cannot resolve. A pair with fewer than MIN_TIE_REPLICATES
    replicates finite in both ranks by its scores alone.
    """
    scores = np.asarray(scores_b, np.float64)
    valid = np.asarray(valid_b, bool)
    if scores.ndim != 1 or valid.shape != scores.shape:
        raise ValueError(f"scores_b and valid_b must be [B] of one shape, got {scores.shape} "
                         f"and {valid.shape}")
    if not np.all(np.isfinite(scores[valid])):
        raise ValueError("valid rows must have finite scores")
    if tie_se < 0:
        raise ValueError(f"tie_se must be >= 0, got {tie_se}")
    boot = None
    if boot_bk is not None and tie_se > 0:
        boot = np.asarray(boot_bk, np.float64)
        if boot.ndim != 2 or boot.shape[0] != scores.shape[0]:
            raise ValueError(f"boot_bk must be [B, K] with B = {scores.shape[0]}, got "
                             f"{boot.shape}")
    groups = np.zeros(scores.shape, np.int64) if group_ids_b is None else np.asarray(group_ids_b)
    out = np.zeros(scores.shape, np.float32)
    for g in np.unique(groups[valid]):
        rows = np.flatnonzero(valid & (groups == g))
        n = rows.size
        if n < 2:
            continue
        s = scores[rows]
        gap = s[:, None] - s[None, :]  # [n, n]: row i's score minus row j's
        tol = np.zeros((n, n))
        if boot is not None:
            d = boot[rows][:, None, :] - boot[rows][None, :, :]  # [n, n, K]
            both = np.isfinite(d)
            k = both.sum(axis=2)
            mean = np.where(both, d, 0.0).sum(axis=2) / np.maximum(k, 1)
            var = np.where(both, (d - mean[..., None]) ** 2, 0.0).sum(axis=2) / np.maximum(
                k - 1, 1)
            tol = np.where(k >= MIN_TIE_REPLICATES, tie_se * np.sqrt(var), 0.0)
        wins = (gap > tol) + 0.5 * (np.abs(gap) <= tol)
        np.fill_diagonal(wins, 0.0)
        rank = wins.sum(axis=1)
        out[rows] = coef * (rank / (n - 1) - 0.5)
    return out
