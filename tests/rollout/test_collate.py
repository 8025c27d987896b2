"""Episodes → learner batch: alignment of prompt, response, behaviour log-probs and Δt."""

import types

import numpy as np
import pytest

from rl4mle_jax.rollout.collate import (
    ShapeForecast,
    bucket_length,
    build_batch,
    compile_pays_off,
    episode_durations,
    smallest_cover,
)


def _exp(i, prompt, resp, logp, reward, started=0.0, finished=1.0, duration_s=0.0):
    return types.SimpleNamespace(episode_id=i, prompt_ids=prompt, response_ids=resp,
                                 logprobs=logp, reward=reward, started_at=started,
                                 finished_at=finished, duration_s=duration_s)


def test_build_batch_layout():
    exps = [_exp(0, [5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], 1.0, 0.0, 2.0, 1.5),
            _exp(1, [4], [3], [-0.5], -10.0, 1.0, 1.5, 0.0)]
    b = build_batch(exps, max_prompt=3, max_response=4, pad_id=0)
    np.testing.assert_array_equal(b["tokens"], [[0, 5, 6, 7, 8, 9, 0], [0, 0, 4, 3, 0, 0, 0]])
    np.testing.assert_array_equal(b["attention_mask"], [[0, 1, 1, 1, 1, 1, 0],
                                                        [0, 0, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(b["response_mask"], [[0, 0, 0, 1, 1, 1, 0],
                                                       [0, 0, 0, 1, 0, 0, 0]])
    np.testing.assert_allclose(b["old_logprobs"][0], [0, 0, 0, -0.1, -0.2, -0.3, 0])
    np.testing.assert_allclose(b["old_logprobs"][1], [0, 0, 0, -0.5, 0, 0, 0])
    np.testing.assert_allclose(b["rewards"], [1.0, -10.0])
    np.testing.assert_allclose(b["dt_s"], [2.0, 0.5])
    np.testing.assert_allclose(episode_durations(exps, "execution"), [1.5, 0.05])


def test_build_batch_errors_name_the_episode():
    with pytest.raises(ValueError, match="episode 3: prompt has 4 tokens, over max_prompt"):
        build_batch([_exp(3, [1, 2, 3, 4], [5], [0.0], 0.0)], 3, 4, 0)
    with pytest.raises(ValueError, match="episode 4: 2 logprobs for 1 response tokens"):
        build_batch([_exp(4, [1], [5], [0.0, 0.0], 0.0)], 3, 4, 0)
    with pytest.raises(ValueError, match="duration source"):
        episode_durations([], "cpu")


def test_build_batch_pads_to_its_length_bucket():
    """P and R: the longest prompt / response rounded up to the bucket, capped at the maxima;
    the real tokens are those of the max-padded batch, with the same alignment."""
    exps = [_exp(0, [5, 6, 7, 8, 9], [1, 2], [-0.1, -0.2], 1.0),
            _exp(1, [4], [3, 3, 3, 3, 3, 3, 3], [-0.5] * 7, 0.0)]
    b = build_batch(exps, max_prompt=16, max_response=32, pad_id=0, length_bucket=4)
    full = build_batch(exps, max_prompt=16, max_response=32, pad_id=0)
    assert b["tokens"].shape == (2, 8 + 8) and full["tokens"].shape == (2, 48)
    for k in ("tokens", "attention_mask", "response_mask", "old_logprobs"):
        np.testing.assert_array_equal(b[k], full[k][:, 16 - 8:16 + 8], err_msg=k)
        assert not full[k][:, :16 - 8].any() and not full[k][:, 16 + 8:].any()
    capped = build_batch(exps, max_prompt=6, max_response=7, pad_id=0, length_bucket=4)
    assert capped["tokens"].shape == (2, 6 + 7)
    assert bucket_length(0, 64, 512) == 64 and bucket_length(65, 64, 512) == 128
    assert bucket_length(500, 64, 480) == 480 and bucket_length(3, 0, 512) == 512
    exact = build_batch(exps, max_prompt=16, max_response=32, pad_id=0, pad_to=(12, 7))
    np.testing.assert_array_equal(exact["tokens"], full["tokens"][:, 16 - 12:16 + 7])
    with pytest.raises(ValueError, match="shorter than the batch's longest"):
        build_batch(exps, max_prompt=16, max_response=32, pad_id=0, pad_to=(4, 7))


def test_shape_forecast_matches_drawn_batches():
    """The exact law of the batch's padded (P, R) equals a NumPy Monte Carlo of batches of B
    drawn from the window, over correlated prompt and response lengths."""
    rng = np.random.default_rng(0)
    fc = ShapeForecast(batch_size=4, max_prompt=512, max_response=768, length_bucket=64,
                       window=50)
    for _ in range(80):  # the first 30 fall out of the window
        p = int(rng.integers(380, 512))
        fc.observe(p, int(rng.integers(180, 330)) + (p > 470) * 60)
    probs = fc.probabilities()
    assert abs(sum(probs.values()) - 1.0) < 1e-9
    obs = np.asarray(fc.seen)
    draws = obs[rng.integers(0, len(obs), (40_000, 4))].max(axis=1)  # [n, 2] padded (P, R)
    shapes, counts = np.unique(draws, axis=0, return_counts=True)
    mc = {(int(p), int(r)): c / len(draws) for (p, r), c in zip(shapes, counts)}
    assert set(mc) <= set(probs)
    for s, q in probs.items():
        assert abs(q - mc.get(s, 0.0)) < 0.01, (s, q, mc.get(s))
    likely = fc.likely(0.1)
    assert likely and all(probs[s] >= 0.1 for s in likely)
    assert [probs[s] for s in likely] == sorted((probs[s] for s in likely), reverse=True)
    assert ShapeForecast(8, 512, 768, 64).probabilities() == {}
    capped = ShapeForecast(2, 100, 50, 64)
    capped.observe(90, 10)
    assert capped.probabilities() == {(100, 50): 1.0}


def test_smallest_cover_is_the_cheapest_compiled_shape_that_holds_the_batch():
    compiled = {(512, 320), (512, 768), (448, 384), (384, 256)}
    assert smallest_cover((512, 256), compiled) == (512, 320)  # 832 tokens, not 1280
    assert smallest_cover((448, 256), compiled) == (448, 384)  # 832 too: fewer prompt columns
    assert smallest_cover((384, 256), compiled) == (384, 256)  # itself
    assert smallest_cover((512, 448), compiled) == (512, 768)
    assert smallest_cover((576, 64), compiled) is None  # nothing holds a longer prompt
    assert smallest_cover((64, 64), set()) is None


def test_compile_pays_off_weighs_the_expected_saving_against_the_compiles_share():
    # NumPy reference: saving = p x steps left x s/token x tokens saved; cost = compile x share.
    rng = np.random.default_rng(0)
    for _ in range(200):
        p, left, per_tok = rng.uniform(0, 1), rng.uniform(0, 60), rng.uniform(0, 0.01)
        tokens, cover = int(rng.integers(256, 1024)), int(rng.integers(256, 1536))
        compile_s, share, payback = rng.uniform(1, 60), rng.choice([0.5, 1 / 16]), 1.0
        saving = p * left * per_tok * np.maximum(cover - tokens, 0)
        assert compile_pays_off(p, left, per_tok, tokens, cover, compile_s, share, payback) == (
            saving >= payback * compile_s * share)
    # The trade-off run on 2 cores: ~3.7 ms/token, (832, 256) padded to (1024, 320) saves
    # 256 tokens a step; a 40 s compile is not worth 10 steps at p=0.3, a 5 s cached one is.
    assert not compile_pays_off(0.3, 10, 3.7e-3, 1088, 1344, 40.0, 0.5)
    assert compile_pays_off(0.3, 10, 3.7e-3, 1088, 1344, 5.0, 0.5)
    # No compiled shape holds it (its first step would compile): always; payback 0 (the old
    # behaviour), or a compile that costs the loop nothing (an accelerator's host): always.
    assert compile_pays_off(0.01, 1, 1e-4, 1088, None, 60.0, 0.5)
    assert compile_pays_off(0.01, 1, 1e-4, 1088, 1344, 60.0, 0.5, payback=0.0)
    assert compile_pays_off(0.01, 1, 1e-4, 1088, 1344, 60.0, 0.0)
    assert not compile_pays_off(1.0, 0, 1e-2, 1088, 1344, 1.0, 0.5)  # no steps left


def test_credit_mask_holds_the_credit_span_or_the_whole_response():
    exps = [_exp(0, [5, 6], [7, 8, 9, 10], [-0.1] * 4, -10.0),
            _exp(1, [4], [3, 2], [-0.5] * 2, 1.0),
            _exp(2, [4], [], [], -10.0)]
    exps[0].credit_span = (1, 3)  # a syntax error on the response's tokens 1 and 2
    b = build_batch(exps, max_prompt=2, max_response=4, pad_id=0)
    np.testing.assert_array_equal(b["credit_mask"], [[0, 0, 0, 1, 1, 0],
                                                     [0, 0, 1, 1, 0, 0],
                                                     [0, 0, 0, 0, 0, 0]])
    exps[0].credit_span = (2, 5)
    with pytest.raises(ValueError, match="episode 0: credit_span"):
        build_batch(exps, max_prompt=2, max_response=4, pad_id=0)
