"""GAE, whitening and group baselines against NumPy loops on a left/right padded batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.rl import advantages as adv_lib

# Prompt region 3 (left padded), response region 5 (right padded); row 3 has no response.
MASK = np.array([
    [0, 0, 0, 1, 1, 1, 1, 1],
    [0, 0, 0, 1, 1, 1, 0, 0],
    [0, 0, 0, 1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 1, 0, 0, 0],
], np.float32)
B, T = MASK.shape
SCORES = np.array([0.67, -10.0, 0.62, 5.0, -9.8], np.float32)


def _np_token_rewards(scores, mask, kl=None, coef=0.0):
    r = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[i, t]]
        if valid:
            r[i, valid[-1]] = scores[i]
        for t in valid:
            r[i, t] -= coef * (kl[i, t] if kl is not None else 0.0)
    return r


def _np_gae(rewards, values, mask, gamma, lam):
    """Per row: walk the response tokens backwards (the textbook recursion, no carry tricks)."""
    adv = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        idx = [t for t in range(mask.shape[1]) if mask[i, t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[i, t] + gamma * next_v - values[i, t]
            adv[i, t] = delta + gamma * lam * next_a
            next_v, next_a = values[i, t], adv[i, t]
    return adv, (adv + values) * mask


def _np_whiten(x, mask):
    vals = np.array([x[i, t] for i in range(B) for t in range(T) if mask[i, t]], np.float64)
    mean, var = vals.mean(), vals.var(ddof=1)
    return (x - mean) / np.sqrt(var + 1e-8) * mask


def test_token_rewards_with_kl_penalty():
    kl = np.random.default_rng(0).uniform(0, 1, (B, T)).astype(np.float32)
    got = adv_lib.token_rewards(jnp.asarray(SCORES), jnp.asarray(MASK), jnp.asarray(kl), 0.1)
    np.testing.assert_allclose(np.asarray(got), _np_token_rewards(SCORES, MASK, kl, 0.1),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy(gamma, lam):
    rng = np.random.default_rng(1)
    values = rng.normal(0, 1, (B, T)).astype(np.float32)
    rewards = _np_token_rewards(SCORES, MASK) + rng.normal(0, 0.1, (B, T)) * MASK
    out = adv_lib.gae(jnp.asarray(rewards, jnp.float32), jnp.asarray(values), jnp.asarray(MASK),
                      gamma, lam)
    ref_adv, ref_ret = _np_gae(rewards, values, MASK, gamma, lam)
    np.testing.assert_allclose(np.asarray(out.advantages_bt), ref_adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.returns_bt), ref_ret, rtol=1e-5, atol=1e-6)


def test_gae_default_is_reward_to_go_minus_value():
    values = np.random.default_rng(2).normal(0, 1, (B, T)).astype(np.float32)
    out = jax.jit(adv_lib.gae)(jnp.asarray(_np_token_rewards(SCORES, MASK), jnp.float32),
                               jnp.asarray(values), jnp.asarray(MASK))
    # γ = λ = 1, reward only at the end: A_t = score − V_t, returns = score on every token
    np.testing.assert_allclose(np.asarray(out.advantages_bt), (SCORES[:, None] - values) * MASK *
                               (MASK.sum(1) > 0)[:, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.returns_bt), SCORES[:, None] * MASK, rtol=1e-6)


def test_whiten_matches_numpy():
    x = np.random.default_rng(3).normal(2, 3, (B, T)).astype(np.float32)
    x[MASK == 0] = 1e4  # padding must not enter the statistics
    got = np.asarray(adv_lib.whiten(jnp.asarray(x), jnp.asarray(MASK)))
    np.testing.assert_allclose(got, _np_whiten(x, MASK), rtol=1e-5, atol=1e-6)
    kept = np.asarray(adv_lib.whiten(jnp.asarray(x), jnp.asarray(MASK), shift_mean=False))
    mean = x[MASK > 0].mean()
    np.testing.assert_allclose(kept[MASK > 0], got[MASK > 0] + mean, rtol=1e-5)


def _np_group(scores, valid, groups, method):
    out = np.zeros(len(scores))
    for i in range(len(scores)):
        if not valid[i]:
            continue
        members = [j for j in range(len(scores)) if valid[j] and groups[j] == groups[i]]
        if len(members) < 2:
            continue
        vals = np.array([scores[j] for j in members], np.float64)
        if method == "grpo":
            out[i] = (scores[i] - vals.mean()) / (vals.std(ddof=1) + 1e-6)
        else:
            others = [scores[j] for j in members if j != i]
            out[i] = scores[i] - np.mean(others)
    return out


@pytest.mark.parametrize("method", ["grpo", "rloo"])
def test_group_baselines_match_numpy(method):
    scores = np.array([1.0, 0.2, -3.0, 0.7, 0.7, 2.5, 9.0], np.float32)
    groups = np.array([0, 0, 0, 1, 1, 2, 0], np.int32)  # group 2 is a singleton
    valid = np.array([1, 1, 1, 1, 1, 1, 0], np.float32)  # row 6: padding
    got = adv_lib.group_advantages(jnp.asarray(scores), jnp.asarray(valid), jnp.asarray(groups),
                                   method)
    np.testing.assert_allclose(np.asarray(got), _np_group(scores, valid, groups, method),
                               rtol=1e-5, atol=1e-6)


def test_compute_advantages_registry():
    rng = np.random.default_rng(4)
    values = rng.normal(0, 1, (B, T)).astype(np.float32)
    kl = rng.uniform(0, 0.5, (B, T)).astype(np.float32)
    out = adv_lib.compute_advantages("gae", jnp.asarray(SCORES), jnp.asarray(MASK),
                                     values_bt=jnp.asarray(values), kl_bt=jnp.asarray(kl),
                                     kl_coef=0.05)
    ref_adv, ref_ret = _np_gae(_np_token_rewards(SCORES, MASK, kl, 0.05), values, MASK, 1, 1)
    np.testing.assert_allclose(np.asarray(out.advantages_bt), _np_whiten(ref_adv, MASK),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.returns_bt), ref_ret, rtol=1e-5, atol=1e-6)

    groups = np.array([0, 0, 1, 1, 1], np.int32)
    out = adv_lib.compute_advantages("rloo", jnp.asarray(SCORES), jnp.asarray(MASK),
                                     group_ids_b=jnp.asarray(groups))
    per_seq = _np_group(SCORES, MASK.sum(1) > 0, groups, "rloo")
    np.testing.assert_allclose(np.asarray(out.advantages_bt), per_seq[:, None] * MASK,
                               rtol=1e-5, atol=1e-6)
    out = adv_lib.compute_advantages("grpo", jnp.asarray(SCORES), jnp.asarray(MASK),
                                     whiten_advantages=True)
    per_seq = _np_group(SCORES, MASK.sum(1) > 0, np.zeros(B), "grpo")
    np.testing.assert_allclose(np.asarray(out.advantages_bt),
                               _np_whiten(per_seq[:, None] * MASK, MASK), rtol=1e-4, atol=1e-5)


def test_bad_inputs_name_the_tensor():
    with pytest.raises(ValueError, match="advantage estimator 'ppo' is not one of"):
        adv_lib.compute_advantages("ppo", jnp.asarray(SCORES), jnp.asarray(MASK))
    with pytest.raises(ValueError, match="'gae' needs values_bt"):
        adv_lib.compute_advantages("gae", jnp.asarray(SCORES), jnp.asarray(MASK))
    with pytest.raises(AssertionError, match="scores_b must be"):
        adv_lib.compute_advantages("grpo", jnp.asarray(SCORES[:3]), jnp.asarray(MASK))
    with pytest.raises(AssertionError, match="values_bt must match response_mask_bt"):
        adv_lib.gae(jnp.zeros((B, T)), jnp.zeros((B, T + 1)), jnp.asarray(MASK))
    with pytest.raises(ValueError, match="group baseline 'mean'"):
        adv_lib.group_advantages(jnp.asarray(SCORES), jnp.ones(B), method="mean")


def test_group_size_zero_is_one_group_over_the_whole_batch():
    from rl4mle_jax.rl.batch import prepare_batch
    from rl4mle_jax.rl.learner_config import LearnerConfig

    cfg = LearnerConfig(critic="none", advantage_estimator="rloo", group_size=0)
    batch = {"tokens": np.zeros((B, T), np.int32), "attention_mask": np.ones((B, T), np.float32),
             "response_mask": MASK, "old_logprobs": np.zeros((B, T), np.float32),
             "rewards": SCORES, "dt_s": np.ones(B, np.float32)}
    groups = prepare_batch(batch, cfg)["group_ids"]
    np.testing.assert_array_equal(groups, np.zeros(B))
    out = adv_lib.compute_advantages("rloo", jnp.asarray(SCORES), jnp.asarray(MASK),
                                     group_ids_b=jnp.asarray(groups))
    valid = MASK.sum(1) > 0  # the row without a response is neither baseline nor trained
    ref = np.array([SCORES[i] - SCORES[valid & (np.arange(B) != i)].mean() if valid[i] else 0
                    for i in range(B)])
    np.testing.assert_allclose(np.asarray(out.advantages_bt), ref[:, None] * MASK, rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="group_size must be >= 0"):
        LearnerConfig(critic="none", advantage_estimator="rloo", group_size=-1)


def test_a_batch_of_equal_scores_has_zero_advantages_but_keeps_its_returns():
    """zero_flat: whitened GAE of equal scores would be the critic's errors at unit scale."""
    rng = np.random.default_rng(5)
    values = rng.normal(0, 0.1, (B, T)).astype(np.float32)
    flat = np.full(B, -10.0, np.float32)
    flat[3] = 7.0  # row 3 has no response: its score does not count
    noisy = adv_lib.compute_advantages("gae", jnp.asarray(flat), jnp.asarray(MASK),
                                       values_bt=jnp.asarray(values))
    ref_adv, ref_ret = _np_gae(_np_token_rewards(flat, MASK), values, MASK, 1, 1)
    np.testing.assert_allclose(np.asarray(noisy.advantages_bt), _np_whiten(ref_adv, MASK),
                               rtol=1e-4, atol=1e-5)
    assert np.std(np.asarray(noisy.advantages_bt)[MASK > 0]) > 0.9  # noise at unit scale
    zeroed = adv_lib.compute_advantages("gae", jnp.asarray(flat), jnp.asarray(MASK),
                                        values_bt=jnp.asarray(values), zero_flat=True)
    np.testing.assert_array_equal(np.asarray(zeroed.advantages_bt), 0.0)
    np.testing.assert_allclose(np.asarray(zeroed.returns_bt), ref_ret, rtol=1e-5, atol=1e-6)
    # Any spread among the rows with responses: unchanged.
    kept = adv_lib.compute_advantages("gae", jnp.asarray(SCORES), jnp.asarray(MASK),
                                      values_bt=jnp.asarray(values), zero_flat=True)
    ref_adv, _ = _np_gae(_np_token_rewards(SCORES, MASK), values, MASK, 1, 1)
    np.testing.assert_allclose(np.asarray(kept.advantages_bt), _np_whiten(ref_adv, MASK),
                               rtol=1e-4, atol=1e-5)
    # KL in the reward is a signal of its own: not zeroed.
    kl = rng.uniform(0, 0.5, (B, T)).astype(np.float32)
    with_kl = adv_lib.compute_advantages("gae", jnp.asarray(flat), jnp.asarray(MASK),
                                         values_bt=jnp.asarray(values), kl_bt=jnp.asarray(kl),
                                         kl_coef=0.05, zero_flat=True)
    assert np.abs(np.asarray(with_kl.advantages_bt)).max() > 0.1


def _np_rank_bonus(scores, valid, coef, groups):
    """Reference: scipy's average ranks, per group, over the valid rows only."""
    from scipy.stats import rankdata
    out = np.zeros(len(scores))
    for g in set(np.asarray(groups)[np.asarray(valid, bool)].tolist()):
        rows = [i for i in range(len(scores)) if valid[i] and groups[i] == g]
        if len(rows) < 2:
            continue
        ranks = rankdata([scores[i] for i in rows], method="average") - 1.0
        for i, r in zip(rows, ranks):
            out[i] = coef * (r / (len(rows) - 1) - 0.5)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_valid_rank_bonus_matches_average_ranks(seed):
    rng = np.random.default_rng(seed)
    b = 12
    # Few distinct scores so that ties occur; failures carry the failure reward.
    scores = rng.choice([0.859, 0.861, 0.874, 0.874, 0.5], size=b)
    valid = rng.random(b) < 0.75
    scores = np.where(valid, scores, -10.0)
    groups = rng.integers(0, 3, size=b)
    got = adv_lib.valid_rank_bonus(scores, valid, 0.8, groups)
    np.testing.assert_allclose(got, _np_rank_bonus(scores, valid, 0.8, groups), atol=1e-6)
    assert np.all(got[~valid] == 0)
    for g in np.unique(groups):  # zero-sum over each group's valid rows: their mean is kept
        assert abs(got[(groups == g) & valid].sum()) < 1e-5
    assert np.all(np.abs(got) <= 0.4 + 1e-6)


def _np_tied_rank_bonus(scores, valid, coef, groups, boot, tie_se, min_k):
    """Reference: pair by pair, a win unless the gap is within tie_se standard deviations of
    the pair's replicate differences (sample std over replicates finite in both)."""
    out = np.zeros(len(scores))
    for g in set(np.asarray(groups)[np.asarray(valid, bool)].tolist()):
        rows = [i for i in range(len(scores)) if valid[i] and groups[i] == g]
        for i in rows:
            rank = 0.0
            for j in rows:
                if j == i:
                    continue
                d = [a - b for a, b in zip(boot[i], boot[j]) if np.isfinite(a - b)]
                tol = tie_se * float(np.std(d, ddof=1)) if len(d) >= min_k else 0.0
                gap = scores[i] - scores[j]
                rank += 1.0 if gap > tol else 0.5 if abs(gap) <= tol else 0.0
            if len(rows) > 1:
                out[i] = coef * (rank / (len(rows) - 1) - 0.5)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tie_se", [0.5, 1.0, 2.0])
def test_valid_rank_bonus_ties_gaps_within_the_paired_standard_error(seed, tie_se):
    rng = np.random.default_rng(seed)
    b, k = 14, 64
    quality = rng.choice([0.80, 0.84, 0.845, 0.85, 0.86], size=b)
    # Shared resamples: a common per-replicate shift plus each row's own small noise.
    common = rng.normal(0, 0.03, k)
    boot = quality[:, None] + common[None, :] + rng.normal(0, 0.006, (b, k))
    boot[rng.random((b, k)) < 0.1] = np.nan  # undefined resamples
    boot[3, 40:] = np.nan  # too few replicates left for row 3's pairs: its scores decide
    scores = quality + rng.normal(0, 0.004, b)
    valid = rng.random(b) < 0.8
    scores = np.where(valid, scores, -10.0)
    groups = rng.integers(0, 2, size=b)
    min_k = adv_lib.MIN_TIE_REPLICATES
    got = adv_lib.valid_rank_bonus(scores, valid, 0.8, groups, boot, tie_se)
    np.testing.assert_allclose(
        got, _np_tied_rank_bonus(scores, valid, 0.8, groups, boot, tie_se, min_k), atol=1e-6)
    for g in np.unique(groups):  # still zero-sum over each group's valid rows
        assert abs(got[(groups == g) & valid].sum()) < 1e-5
    assert np.all(got[~valid] == 0)
    # Without replicates, or tie_se 0: the plain average ranks.
    plain = _np_rank_bonus(scores, valid, 0.8, groups)
    np.testing.assert_allclose(adv_lib.valid_rank_bonus(scores, valid, 0.8, groups, boot, 0.0),
                               plain, atol=1e-6)
    np.testing.assert_allclose(adv_lib.valid_rank_bonus(scores, valid, 0.8, groups, None, 1.0),
                               plain, atol=1e-6)
    assert not np.allclose(got, plain)  # these draws have gaps within the standard error


def test_valid_rank_bonus_tie_examples():
    f = adv_lib.valid_rank_bonus
    k = np.linspace(-1, 1, 32)
    # Gaps of 0.002 under a paired standard error of ~0.01: all three tie, no bonus.
    boot = np.stack([0.870 + 0.03 * k + 0.01 * np.sin(7 * k),
                     0.868 + 0.03 * k - 0.01 * np.sin(7 * k),
                     0.866 + 0.03 * k + 0.01 * np.cos(5 * k)])
    np.testing.assert_allclose(f([0.870, 0.868, 0.866], [1, 1, 1], 1.0, None, boot, 1.0), 0.0,
                               atol=1e-7)
    # A clear gap still ranks: the 0.95 row wins both pairs, the two close rows tie.
    far = boot.copy()
    far[0] += 0.08
    np.testing.assert_allclose(f([0.950, 0.868, 0.866], [1, 1, 1], 1.0, None, far, 1.0),
                               [0.5, -0.25, -0.25], atol=1e-7)
    # Identical programs (identical replicates): a tie, as with equal scores.
    np.testing.assert_allclose(f([0.87, 0.87], [1, 1], 1.0, None, boot[[0, 0]], 1.0), 0.0)
    with pytest.raises(ValueError, match="tie_se"):
        f([0.8, 0.9], [1, 1], 1.0, None, boot[:2], -1.0)
    with pytest.raises(ValueError, match="boot_bk"):
        f([0.8, 0.9], [1, 1], 1.0, None, boot, 1.0)


def test_valid_rank_bonus_edge_cases():
    f = adv_lib.valid_rank_bonus
    # One group (None): best +coef/2, worst -coef/2, the failure untouched.
    np.testing.assert_allclose(f([0.87, -10.0, 0.85, 0.86], [1, 0, 1, 1], 1.0),
                               [0.5, 0.0, -0.5, 0.0])
    # Equal scores, one valid row, no valid row: no ranking to give.
    np.testing.assert_allclose(f([0.87, 0.87, -10.0], [1, 1, 0], 1.0), [0.0, 0.0, 0.0])
    np.testing.assert_allclose(f([0.87, -10.0], [1, 0], 1.0), [0.0, 0.0])
    np.testing.assert_allclose(f([-10.0, -9.9], [0, 0], 1.0), [0.0, 0.0])
    with pytest.raises(ValueError, match="one shape"):
        f([0.8, 0.9], [1, 1, 0], 1.0)
    with pytest.raises(ValueError, match="finite"):
        f([0.8, float("nan")], [1, 1], 1.0)
