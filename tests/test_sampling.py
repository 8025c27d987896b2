"""Sampler: greedy parity with transformers' generate, log-probs vs a full forward pass, stop
tokens, top-k/top-p against a NumPy reference, no recompilation within a bucket, and the growing
cache (its phases) against one cache of the whole bucket."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.models import get_preset, load_hf_checkpoint, logits
from rl4mle_jax.sampling import Sampler, cache_phases, sampling_logprobs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, PAD = 101, 0
NO_STOP = VOCAB  # an id the model cannot emit: rows never stop early
PROMPTS = [[5, 17, 33, 2, 9, 41, 77], [12, 3], [60, 61, 62, 63, 64]]


def _hf_model(tmp_path, tie: bool, kv_heads: int):
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
        tie_word_embeddings=tie, rope_theta=10000.0, rms_norm_eps=1e-6,
        initializer_range=0.2,  # peaky logits: greedy argmax is far from ties
        bos_token_id=None, eos_token_id=None, pad_token_id=PAD)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    model.save_pretrained(tmp_path)
    return model


def _load(tmp_path_factory, tie, kv_heads):
    d = tmp_path_factory.mktemp("qwen_tiny")
    hf = _hf_model(d, tie, kv_heads)
    config, params = load_hf_checkpoint(d)
    sampler = Sampler(config, stop_token_ids=[NO_STOP], pad_id=PAD, prompt_buckets=(8, 16),
                      batch_buckets=(1, 2, 4), max_new_tokens=32, new_token_buckets=(16, 32),
                      cache_phase_tokens=4)  # the cache grows at 4, 8, 16 new tokens
    return hf, config, params, sampler


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """Tied embeddings, 2 query heads per kv head; the model most tests use."""
    return _load(tmp_path_factory, True, 2)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """Untied lm_head, plain multi-head attention (GQA ratio 1)."""
    return _load(tmp_path_factory, False, 4)


@pytest.fixture(scope="module", params=["tied", "untied"])
def both(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def models(tied):
    return tied[:3]


@pytest.fixture(scope="module")
def sampler(tied):
    return tied[3]


def _hf_greedy(hf, prompts, max_new, eos):
    p = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (p - len(x)) + x for x in prompts])
    mask = torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                          min_new_tokens=0, do_sample=False, eos_token_id=eos, pad_token_id=PAD)
    return out[:, p:].numpy()


def _full_logprobs(config, params, prompts, out):
    """log_softmax logits [N, max_new, V] at the generated positions, from one forward pass."""
    seqs = [list(pr) + list(out.tokens[i, :out.lengths[i]]) for i, pr in enumerate(prompts)]
    t = max(map(len, seqs))
    toks = np.array([[PAD] * (t - len(s)) + s for s in seqs], np.int32)
    mask = np.array([[0] * (t - len(s)) + [1] * len(s) for s in seqs], np.int32)
    lg = np.asarray(jax.jit(logits, static_argnums=0)(config, params, toks, mask))
    n_new = out.tokens.shape[1]
    res = np.zeros((len(seqs), n_new, lg.shape[-1]), np.float32)
    for i, s in enumerate(seqs):
        start = t - len(s) + len(prompts[i]) - 1  # logits predicting the first new token
        n = out.lengths[i]
        res[i, :n] = lg[i, start:start + n]
    return res


def _np_sampling_logprobs(logits_v, temperature, top_k, top_p, min_p=0.0):
    """NumPy reference: temperature, then top-k, then top-p (keep while mass before < p), then
    min-p (keep p >= min_p * max p)."""
    x = logits_v.astype(np.float64) / temperature
    if 0 < top_k < x.size:
        x = np.where(x < np.sort(x)[::-1][top_k - 1], -np.inf, x)
    if top_p < 1:
        p = np.exp(x - x.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        mass_before = np.cumsum(p[order]) - p[order]
        drop = order[(mass_before >= top_p) & (np.arange(x.size) > 0)]
        x = x.copy()
        x[drop] = -np.inf
    if min_p > 0:
        p = np.exp(x - x.max())
        x = np.where(p < min_p * p.max(), -np.inf, x)
    z = x - x.max()
    return z - np.log(np.exp(z).sum())


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]], ids=["batch3_leftpad", "batch1"])
def test_greedy_matches_transformers_generate(both, prompts):
    hf, _, params, sampler = both
    want = _hf_greedy(hf, prompts, 32, eos=NO_STOP)
    out = sampler.generate(params, prompts, jax.random.key(0), max_new_tokens=32, greedy=True)
    np.testing.assert_array_equal(out.tokens, want)
    # With a stop token that greedy decoding hits, rows end there in both implementations.
    stop = int(want[0, 10])
    want = _hf_greedy(hf, prompts, 32, eos=stop)
    out = sampler.generate(params, prompts, jax.random.key(0), max_new_tokens=32, greedy=True,
                           stop_token_ids=[stop])
    w = want.shape[1]  # transformers stops once every row is done
    np.testing.assert_array_equal(out.tokens[:, :w], want)
    assert (out.tokens[:, w:] == PAD).all()
    assert out.lengths[0] <= 11 and out.tokens[0, out.lengths[0] - 1] == stop


def test_logprobs_match_full_forward_at_temperature_1(both):
    _, config, params, sampler = both
    out = sampler.generate(params, PROMPTS, jax.random.key(1), max_new_tokens=20)
    again = sampler.generate(params, PROMPTS, jax.random.key(1), max_new_tokens=20)
    np.testing.assert_array_equal(out.tokens, again.tokens)  # same key, same sample
    ref = _full_logprobs(config, params, PROMPTS, out)
    for i in range(len(PROMPTS)):
        n = out.lengths[i]
        want = np.take_along_axis(ref[i, :n], out.tokens[i, :n, None], axis=-1)[:, 0]
        want -= np.log(np.exp(ref[i, :n]).sum(-1))  # log_softmax of raw logits
        np.testing.assert_allclose(out.logprobs[i, :n], want, atol=1e-4)
    assert out.tokens.shape == (3, 20) and (out.lengths == 20).all()


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.8, 0.0),
                                               (7, 0.6, 0.0), (0, 1.0, 0.3), (6, 0.9, 0.1)])
def test_truncated_logprobs_match_reference(models, sampler, top_k, top_p, min_p):
    _, config, params = models
    t = 0.7
    out = sampler.generate(params, PROMPTS, jax.random.key(2), max_new_tokens=20,
                           temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)
    ref = _full_logprobs(config, params, PROMPTS, out)
    for i in range(len(PROMPTS)):
        for j in range(out.lengths[i]):
            lp = _np_sampling_logprobs(ref[i, j], t, top_k, top_p, min_p)
            assert np.isfinite(lp[out.tokens[i, j]]), "sampled a truncated token"
            np.testing.assert_allclose(out.logprobs[i, j], lp[out.tokens[i, j]], atol=1e-4)


def test_sampling_logprobs_unit_vs_numpy():
    rng = np.random.default_rng(0)
    lg = rng.normal(size=(6, 50)).astype(np.float32) * 3
    for t, k, p, m in [(1.0, 0, 1.0, 0.0), (0.5, 3, 1.0, 0.0), (1.3, 0, 0.9, 0.0),
                       (0.7, 10, 0.5, 0.0), (1.0, 0, 1e-6, 0.0), (0.7, 0, 1.0, 0.05),
                       (1.0, 0, 1.0, 0.5), (0.7, 10, 0.9, 0.2), (1.0, 0, 1.0, 0.999)]:
        got = np.asarray(sampling_logprobs(jnp.asarray(lg), t, k, p, use_top_p=p < 1, min_p=m))
        for b in range(lg.shape[0]):
            want = _np_sampling_logprobs(lg[b], t, k, p, m)
            np.testing.assert_array_equal(np.isfinite(got[b]), np.isfinite(want))
            fin = np.isfinite(want)
            np.testing.assert_allclose(got[b][fin], want[fin], atol=1e-5)
    # Same kept sets and probabilities as transformers' warpers (temperature, top-k, top-p,
    # min-p, in the order generate applies them).
    from transformers.generation import logits_process as lp_hf

    for t, k, p, m in [(0.7, 5, 0.8, 0.0), (1.0, 0, 0.9, 0.0), (0.5, 20, 0.3, 0.0),
                       (0.7, 0, 1.0, 0.1), (1.0, 8, 0.9, 0.3)]:
        x = torch.from_numpy(lg)
        x = lp_hf.TemperatureLogitsWarper(t)(None, x)
        if k:
            x = lp_hf.TopKLogitsWarper(k)(None, x)
        if p < 1:
            x = lp_hf.TopPLogitsWarper(p)(None, x)
        if m:
            x = lp_hf.MinPLogitsWarper(m)(None, x)
        want = torch.log_softmax(x, -1).numpy()
        got = np.asarray(sampling_logprobs(jnp.asarray(lg), t, k, p, use_top_p=p < 1, min_p=m))
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], atol=1e-5)
    # Empirical frequencies follow the truncated distribution.
    lp = sampling_logprobs(jnp.asarray(lg[:1]), 0.7, 5, 0.8, use_top_p=True)
    draws = np.asarray(jax.random.categorical(jax.random.key(0), lp[0], shape=(20000,)))
    freq = np.bincount(draws, minlength=50) / draws.size
    np.testing.assert_allclose(freq, np.exp(np.asarray(lp[0])), atol=0.015)


def test_top_k_1_equals_greedy(models, sampler):
    _, _, params = models
    g = sampler.generate(params, PROMPTS, jax.random.key(0), max_new_tokens=32, greedy=True)
    k1 = sampler.generate(params, PROMPTS, jax.random.key(5), max_new_tokens=32, top_k=1,
                          temperature=1.3)
    np.testing.assert_array_equal(g.tokens, k1.tokens)
    np.testing.assert_allclose(k1.logprobs, 0.0, atol=1e-6)  # a point mass


def test_stop_tokens_end_rows(models, sampler):
    _, _, params = models
    base = sampler.generate(params, PROMPTS, jax.random.key(3), max_new_tokens=20)
    stops = [int(base.tokens[0, 3]), int(base.tokens[2, 6])]
    # Same key and shapes as `base`: identical draws up to each row's first stop token.
    out = sampler.generate(params, PROMPTS, jax.random.key(3), max_new_tokens=20,
                           stop_token_ids=stops)
    for i in range(len(PROMPTS)):
        n = out.lengths[i]
        hit = np.flatnonzero(np.isin(base.tokens[i], stops))
        want_n = hit[0] + 1 if hit.size else 20
        assert n == want_n
        np.testing.assert_array_equal(out.tokens[i, :n], base.tokens[i, :n])
        assert (out.tokens[i, n:] == PAD).all() and (out.logprobs[i, n:] == 0).all()
    assert out.lengths[0] <= 4 and out.stopped[0]


def test_no_recompilation_within_bucket(models):
    _, config, params = models
    s = Sampler(config, [NO_STOP], PAD, prompt_buckets=(8, 16), batch_buckets=(2, 4),
                new_token_buckets=(8, 16))
    key = jax.random.key(0)
    s.generate(params, [[1, 2, 3]], key, max_new_tokens=6)
    assert s.num_traces == 1
    # Other prompt lengths, batch sizes, max_new_tokens, temperature, top_p in the same buckets.
    s.generate(params, [[1, 2, 3, 4, 5, 6, 7, 8], [4]], key, max_new_tokens=8, temperature=0.5)
    s.generate(params, [[9] * 5] * 2, key, max_new_tokens=7, temperature=1.5)
    assert s.num_traces == 1 and s._generate_jit._cache_size() == 1
    s.generate(params, [[1] * 12], key, max_new_tokens=6)  # next prompt bucket
    assert s.num_traces == 2
    s.generate(params, [[1]] * 3, key, max_new_tokens=6)  # next batch bucket
    assert s.num_traces == 3 and s._generate_jit._cache_size() == 3


def test_warm_up_compiles_what_generate_then_calls(models):
    """warm_up compiles each batch and prompt bucket of the sizes given, at the call's settings;
    generate at those sizes (other lengths in the same buckets) then traces nothing."""
    _, config, params = models
    s = Sampler(config, [NO_STOP], PAD, prompt_buckets=(8, 16), batch_buckets=(1, 2, 4),
                new_token_buckets=(8, 16))
    key = jax.random.key(0)
    assert s.warm_up(params, range(1, 4), [8, 16], key, max_new_tokens=12, temperature=0.7) == 6
    assert s.warm_up(params, [2], [5], key, max_new_tokens=9, temperature=0.3) == 0  # all there
    for batch, length in ((1, 3), (2, 8), (3, 11), (4, 16)):
        s.generate(params, [[1] * length] * batch, key, max_new_tokens=12, temperature=0.7)
    assert s.num_traces == 6
    s.generate(params, [[1] * 3], key, max_new_tokens=6, temperature=0.7)  # new token bucket
    assert s.num_traces == 7


def test_large_batch_is_chunked(models):
    _, config, params = models
    s = Sampler(config, [NO_STOP], PAD, prompt_buckets=(8,), batch_buckets=(1, 2),
                new_token_buckets=(8,))
    out = s.generate(params, PROMPTS, jax.random.key(0), max_new_tokens=8, greedy=True)
    assert s.num_traces == 2  # a chunk of 2 and a chunk of 1
    for i, pr in enumerate(PROMPTS):
        one = s.generate(params, [pr], jax.random.key(0), max_new_tokens=8, greedy=True)
        np.testing.assert_array_equal(out.tokens[i], one.tokens[0])
    np.testing.assert_array_equal(out.prompt_lengths, [7, 2, 5])
    assert out.tokens.shape == (3, 8) and out.logprobs.shape == (3, 8)


def test_bad_inputs(models, sampler):
    _, config, params = models
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        sampler.generate(params, [[1], []], key)
    with pytest.raises(ValueError, match=r"prompts\[0\] has token id 101 outside \[0, vocab_size"):
        sampler.generate(params, [[1, 101]], key)
    with pytest.raises(ValueError, match="prompt length=17 exceeds the largest bucket 16"):
        sampler.generate(params, [[1] * 17], key)
    with pytest.raises(ValueError, match="max_new_tokens=33 exceeds the largest bucket 32"):
        sampler.generate(params, [[1]], key, max_new_tokens=33)
    with pytest.raises(ValueError, match=r"top_p=1.5 \(in \(0, 1\]\)"):
        sampler.generate(params, [[1]], key, top_p=1.5)
    with pytest.raises(ValueError, match=r"min_p=-0.1 \(in \[0, 1\)\)"):
        sampler.generate(params, [[1]], key, min_p=-0.1)
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
        Sampler(config, [], PAD)
    with pytest.raises(ValueError, match="prompt_buckets must be strictly increasing"):
        Sampler(config, [1], PAD, prompt_buckets=(64, 32))


def test_cache_phases():
    assert cache_phases(1024, 128) == (128, 256, 512, 1024)
    assert cache_phases(768, 128) == (128, 256, 512, 768)
    assert cache_phases(64, 128) == (64,)
    assert cache_phases(128, 128) == (128,)
    assert cache_phases(1024, 0) == (1024,)  # 0: one phase, the whole bucket
    with pytest.raises(ValueError, match="cache_phase_tokens must be >= 0"):
        Sampler(get_preset("tiny"), [1], PAD, cache_phase_tokens=-1)


def test_prefill_in_attention_chunks_equals_one_block(both):
    """The prefill's causal attention in chunks of 3 query rows (of a 16-token prompt bucket)
    gives the tokens and log-probs of one block."""
    _, config, params, _ = both
    kw = dict(prompt_buckets=(16,), batch_buckets=(4,), new_token_buckets=(32,))
    key = jax.random.key(7)
    a, b = (Sampler(config, [NO_STOP], PAD, attention_chunk=c, **kw).generate(
        params, PROMPTS, key, max_new_tokens=20, temperature=1.0) for c in (0, 3))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_growing_cache_equals_one_cache(both, temperature):
    """Phases of 3, 6, 12, 24, 32 new tokens give the tokens of one cache of 16 + 32 slots
    (sampled with the same key too: each step's key is fold_in(rng, step) either way), and
    log-probs equal to float summation order; rows that stop early stop in both."""
    _, config, params, _ = both
    kw = dict(prompt_buckets=(16,), batch_buckets=(4,), new_token_buckets=(32,))
    one = Sampler(config, [NO_STOP], PAD, cache_phase_tokens=0, **kw)
    grown = Sampler(config, [NO_STOP], PAD, cache_phase_tokens=3, **kw)
    key = jax.random.key(7)
    a = one.generate(params, PROMPTS, key, max_new_tokens=30, temperature=temperature)
    b = grown.generate(params, PROMPTS, key, max_new_tokens=30, temperature=temperature)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # A stop id that the rows emit: they end mid-phase, at the same token in both.
    stop = int(a.tokens[0, 9])
    a = one.generate(params, PROMPTS, key, max_new_tokens=30, temperature=temperature,
                     stop_token_ids=[stop])
    b = grown.generate(params, PROMPTS, key, max_new_tokens=30, temperature=temperature,
                       stop_token_ids=[stop])
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert a.lengths[0] <= 10
    assert grown.num_traces == 1  # all phases are one program
