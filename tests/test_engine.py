"""Engine: greedy parity with the Sampler and transformers, log-probs vs a full forward pass,
insertion mid-decode, slot reuse over 100 requests, no recompiles, and the async service."""

import asyncio
import concurrent.futures
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl4mle_jax.engine import Engine, backend_compiles
from rl4mle_jax.models import forward, init_cache, load_hf_checkpoint, logits
from rl4mle_jax.rollout.engine_service import EngineService
from rl4mle_jax.rollout.service import BusySpans
from rl4mle_jax.sampling import Sampler
from tests.test_sampling import NO_STOP, PAD, _hf_greedy, _hf_model, _np_sampling_logprobs

PROMPTS = [[5, 17, 33, 2, 9, 41, 77], [12, 3], [60, 61, 62, 63, 64], [7],
           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [40, 30, 20]]
BUCKETS = (8, 16)


def _load(tmp_path_factory, tie, kv_heads):
    d = tmp_path_factory.mktemp("qwen_tiny")
    hf = _hf_model(d, tie, kv_heads)
    config, params = load_hf_checkpoint(d)
    engine = Engine(config, [NO_STOP], PAD, num_slots=4, prompt_buckets=BUCKETS,
                    max_new_tokens=32)
    engine.warmup(params)
    return hf, config, params, engine


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """Tied embeddings, 2 query heads per kv head."""
    return _load(tmp_path_factory, True, 2)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """Untied lm_head, 4 query heads per kv head."""
    return _load(tmp_path_factory, False, 1)


@pytest.fixture(scope="module", params=["tied", "untied"])
def both(request):
    return request.getfixturevalue(request.param)


def _run(engine, params, prompts, keys=None, **kw):
    """Submits all prompts, runs the engine dry; completions in submission order."""
    ids = [engine.submit(p, jax.random.key(i) if keys is None else keys[i], **kw)
           for i, p in enumerate(prompts)]
    done = {c.request_id: c for c in engine.run(params)}
    assert sorted(done) == sorted(ids) and engine.idle
    return [done[i] for i in ids]


def _full_logits(config, params, prompt, tokens):
    """[len(tokens), V] logits that predicted each generated token, from one forward pass
    (right-padded to 48 tokens: one compile, and later pads never touch a real token)."""
    seq = np.full((1, 48), PAD, np.int32)
    seq[0, :len(prompt) + len(tokens)] = list(prompt) + list(tokens)
    lg = np.asarray(jax.jit(logits, static_argnums=0)(config, params, seq))[0]
    return lg[len(prompt) - 1:len(prompt) - 1 + len(tokens)]


def test_per_row_cache_index_matches_full_forward(tied):
    """The model extension: rows at different lengths, each written at its own cache slot."""
    _, config, params, _ = tied
    rng = np.random.default_rng(0)
    seqs = [rng.integers(1, 100, n).astype(np.int32) for n in (9, 5, 7)]
    fwd = jax.jit(forward, static_argnums=0)
    lengths = np.asarray([5, 1, 3])  # prompt part of each row; the rest is decoded one by one
    padded = np.zeros((3, 9), np.int32)  # right padding: later pads never touch a real token
    for i, s in enumerate(seqs):
        padded[i, :len(s)] = s
    cache = init_cache(config, 3, 12)
    for i, n in enumerate(lengths):  # prefill row i alone at rows [0, n) of a 5-block
        one = init_cache(config, 1, 12)
        block_mask = (np.arange(5) < n)[None].astype(np.int32)
        _, one = fwd(config, params, padded[i:i + 1, :5], np.arange(5)[None], block_mask, one, 0)
        cache = jax.tree.map(lambda c, o, i=i: c.at[i].set(o[0]), cache, one)
    got = [[] for _ in seqs]
    pos = lengths.copy()
    for _ in range(4):
        tok = np.asarray([s[p] for s, p in zip(seqs, pos)])[:, None]
        out, cache = fwd(config, params, tok, pos[:, None], None, cache, jnp.asarray(pos))
        for i in range(3):
            got[i].append(np.asarray(out[i, 0]))
        pos = pos + 1
    full = np.asarray(jax.jit(logits, static_argnums=0)(config, params, padded))
    for i, n0 in enumerate(lengths):
        np.testing.assert_allclose(np.stack(got[i]), full[i, n0:n0 + 4], atol=1e-4)
        assert np.asarray(cache.mask)[i].sum() == lengths[i] + 4


def test_greedy_matches_sampler_and_transformers(both):
    hf, config, params, engine = both
    sampler = Sampler(config, [NO_STOP], PAD, prompt_buckets=BUCKETS, batch_buckets=(8,),
                      new_token_buckets=(32,))
    ref = sampler.generate(params, PROMPTS, jax.random.key(0), max_new_tokens=24, greedy=True)
    want = _hf_greedy(hf, PROMPTS, 24, eos=NO_STOP)
    np.testing.assert_array_equal(ref.tokens, want)
    out = _run(engine, params, PROMPTS, max_new_tokens=24, temperature=0)  # 6 prompts, 4 slots
    for i, c in enumerate(out):
        assert c.tokens == want[i].tolist() and not c.stopped
        np.testing.assert_allclose(c.logprobs, ref.logprobs[i], atol=1e-5)
    if not config.tie_word_embeddings:
        return
    # A stop token that greedy decoding hits: rows end there, as in transformers.
    stop = int(want[0, 10])
    eng = Engine(config, [stop], PAD, num_slots=4, prompt_buckets=BUCKETS, max_new_tokens=32)
    want = _hf_greedy(hf, PROMPTS, 24, eos=stop)
    for i, c in enumerate(_run(eng, params, PROMPTS, max_new_tokens=24, temperature=0)):
        n = len(c.tokens)
        assert c.tokens == want[i, :n].tolist() and (want[i, n:] == PAD).all()
        assert c.stopped == (stop in c.tokens) and c.stopped == (n < 24)
    assert len(out[0].tokens) == 24 and eng.num_traces["generate"] == 1


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (7, 0.6, 0.0), (0, 1.0, 0.2)])
def test_sampled_logprobs_match_full_forward(tied, top_k, top_p, min_p):
    """Mixed per-request temperatures in one engine; each token's log-prob equals the sampling
    distribution recomputed from a full forward pass over the finished sequence."""
    _, config, params, engine = tied
    if top_k or min_p:
        engine = Engine(config, [NO_STOP], PAD, num_slots=4, prompt_buckets=BUCKETS,
                        max_new_tokens=32, top_k=top_k, top_p=top_p, min_p=min_p)
    temps = [1.0, 0.7, 0.0, 1.3, 1.0, 0.5]
    ids = [engine.submit(p, jax.random.key(10 + i), max_new_tokens=20, temperature=t)
           for i, (p, t) in enumerate(zip(PROMPTS, temps))]
    done = {c.request_id: c for c in engine.run(params)}
    for rid, prompt, t in zip(ids, PROMPTS, temps):
        c = done[rid]
        lg = _full_logits(config, params, prompt, c.tokens)
        for j, tok in enumerate(c.tokens):
            if t == 0:  # greedy: argmax, temperature-1 untruncated log-prob
                assert tok == lg[j].argmax()
                want = _np_sampling_logprobs(lg[j], 1.0, 0, 1.0)[tok]
            else:
                want = _np_sampling_logprobs(lg[j], t, top_k, top_p, min_p)[tok]
            assert np.isfinite(want), "sampled a truncated token"
            np.testing.assert_allclose(c.logprobs[j], want, atol=1e-4)
    assert len({tuple(done[r].tokens) for r in ids}) == len(ids)


def test_inserted_mid_decode_equals_alone(tied):
    _, _, params, engine = tied
    prompt, key = [9, 8, 7, 6, 5], jax.random.key(42)
    alone = _run(engine, params, [prompt], keys=[key], max_new_tokens=20, temperature=0.9)[0]
    others = [engine.submit(p, jax.random.key(i), max_new_tokens=30) for i, p in
              enumerate(PROMPTS[:3])]
    start = engine.steps
    for _ in range(7):
        assert engine.step(params) == []
    rid = engine.submit(prompt, key, max_new_tokens=20, temperature=0.9)
    done = {c.request_id: c for c in engine.run(params)}
    assert set(done) == {rid, *others}
    late = done[rid]
    assert late.insert_step == start + 7 and (alone.slot, late.slot) == (0, 3)
    assert late.tokens == alone.tokens
    np.testing.assert_allclose(late.logprobs, alone.logprobs, atol=1e-6)


def test_100_requests_through_4_slots_no_recompiles(tied):
    """Slots are refilled the step they free; each request finishes after exactly its own
    length; nothing is lost; a long mixed run (both prompt buckets, temperatures, limits)
    compiles nothing after warm-up (the fixture's)."""
    _, _, params, engine = tied
    traces = dict(engine.num_traces)
    assert traces == {"prefill": 2, "insert": 2, "generate": 1}
    _run(engine, params, [[1]], max_new_tokens=1)  # warms the host side's eager ops
    compiles = backend_compiles()
    rng = np.random.default_rng(0)
    lengths = {}
    done = []
    for i in range(100):
        prompt = rng.integers(0, 100, rng.integers(1, 17)).tolist()
        n = int(rng.integers(1, 13))
        rid = engine.submit(prompt, jax.random.key(i), max_new_tokens=n,
                            temperature=float(rng.choice([0.0, 0.7, 1.0])))
        lengths[rid] = n
        if i % 10 == 0:
            done += engine.step(params)
    done += engine.run(params)
    assert len(done) == 100 and sorted(c.request_id for c in done) == sorted(lengths)
    assert dict(engine.num_traces) == traces and backend_compiles() == compiles
    for c in done:
        assert len(c.tokens) == lengths[c.request_id] and not c.stopped
        assert c.finish_step - c.insert_step == len(c.tokens)
    finish = [c.finish_step for c in done]
    assert finish == sorted(finish)  # completion order follows each request's own length
    by_slot = {}
    for c in sorted(done, key=lambda c: c.insert_step):
        by_slot.setdefault(c.slot, []).append(c)
    assert sorted(by_slot) == [0, 1, 2, 3]
    for seq in by_slot.values():  # a freed slot takes the next queued request at once
        for a, b in zip(seq, seq[1:]):
            assert b.insert_step == a.finish_step


@pytest.mark.parametrize("k", [3, 4])
def test_steps_per_call_same_tokens_and_slot_reuse(tied, k):
    """k token steps per call: the same tokens and log-probs as one step per call, with stop
    tokens and limits landing inside a call; a freed slot is refilled at the next call
    boundary; no compile after warm-up."""
    _, config, params, one = tied
    rng = np.random.default_rng(1)
    reqs = [(rng.integers(0, 100, rng.integers(1, 17)).tolist(), int(rng.integers(1, 13)),
             float(rng.choice([0.0, 0.7, 1.0]))) for _ in range(30)]
    # a stop id that the model does emit, so some requests stop on it mid-call
    probe = _run(one, params, [r[0] for r in reqs], temperature=1.0, max_new_tokens=12)
    stop = int(np.bincount(np.concatenate([c.tokens for c in probe])).argmax())
    runs = {}
    for steps in (1, k):
        engine = Engine(config, [stop], PAD, num_slots=4, prompt_buckets=BUCKETS,
                        max_new_tokens=32, steps_per_call=steps)
        engine.warmup(params)
        _run(engine, params, [[1]], max_new_tokens=1)  # warms the host side's eager ops
        compiles = backend_compiles()
        ids = [engine.submit(p, jax.random.key(i), max_new_tokens=n, temperature=t)
               for i, (p, n, t) in enumerate(reqs)]
        done = engine.run(params)
        assert engine.num_traces["generate"] == 1 and backend_compiles() == compiles
        assert sorted(c.request_id for c in done) == ids
        runs[steps] = {c.request_id: c for c in done}
    assert any(c.stopped for c in runs[k].values())
    assert any(not c.stopped and len(c.tokens) > 1 for c in runs[k].values())
    for rid, a in runs[1].items():
        b = runs[k][rid]
        assert b.tokens == a.tokens and b.stopped == a.stopped
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5)
        assert b.insert_step % k == 0 and b.finish_step - b.insert_step == len(b.tokens)
    by_slot = {}
    for c in sorted(runs[k].values(), key=lambda c: c.insert_step):
        by_slot.setdefault(c.slot, []).append(c)
    for seq in by_slot.values():  # refilled at the first call boundary after it finished
        for a, b in zip(seq, seq[1:]):
            assert b.insert_step == -(-a.finish_step // k) * k


def test_service_versions_cancellation_and_errors(tied):
    _, _, params, engine = tied
    traces = dict(engine.num_traces)
    state = {"version": 0, "calls": 0}

    def get_params():  # a new policy version every 5 steps
        state["calls"] += 1
        state["version"] = state["calls"] // 5
        return params, state["version"]

    async def main():
        lane = concurrent.futures.ThreadPoolExecutor(1)
        busy = BusySpans()
        svc = EngineService(engine, get_params, lane, jax.random.key(0), max_new_tokens=12,
                            temperature=0.8, top_k=0, max_batch=8, busy=busy)
        svc.start()
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="prompt is empty"):
            await svc.generate([])
        with pytest.raises(ValueError, match="prompt length=17 exceeds the largest bucket"):
            await svc.generate([1] * 17)
        with pytest.raises(asyncio.TimeoutError):  # a cancelled request frees its slot
            await asyncio.wait_for(svc.generate([4, 5]), timeout=0.001)
        gens = await asyncio.gather(*(svc.generate(p) for p in PROMPTS))
        t1 = time.perf_counter()
        # the engine's lane jobs are recorded, so the loop's sampler idle fraction is real
        assert 0.0 < busy.busy_s(t0, t1) <= t1 - t0 and busy.idle_frac(t0, t1) < 1.0
        assert engine.idle  # the cancelled request left too
        await svc.stop()
        lane.shutdown()
        return gens

    gens = asyncio.run(main())
    for g, p in zip(gens, PROMPTS):
        assert g.prompt_ids == p and len(g.response_ids) == len(g.logprobs) == 12
        assert len(g.token_versions) == 12 and g.params_version == g.token_versions[0]
        assert g.token_versions == sorted(g.token_versions)
    assert any(len(set(g.token_versions)) > 1 for g in gens)  # responses spanning updates
    assert engine.idle and dict(engine.num_traces) == traces  # stop() reset it: no retrace
    with pytest.raises(ValueError, match="top_p=0.9 differs from the engine's top_p=1.0"):
        EngineService(engine, get_params, None, jax.random.key(0), top_p=0.9)
    with pytest.raises(ValueError, match="min_p=0.1 differs from the engine's min_p=0.0"):
        EngineService(engine, get_params, None, jax.random.key(0), min_p=0.1)


def test_bad_inputs(tied):
    _, config, _, engine = tied
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"token id 101 outside \[0, vocab_size=101\)"):
        engine.submit([1, 101], key)
    with pytest.raises(ValueError, match=r"max_new_tokens=33 must be in \[1, engine"):
        engine.submit([1], key, max_new_tokens=33)
    with pytest.raises(ValueError, match="temperature=-1 must be >= 0"):
        engine.submit([1], key, temperature=-1)
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
        Engine(config, [], PAD)
    with pytest.raises(ValueError, match="prompt_buckets must be strictly increasing"):
        Engine(config, [1], PAD, prompt_buckets=(16, 8))
    with pytest.raises(ValueError, match="steps_per_call=0 must be >= 1"):
        Engine(config, [1], PAD, steps_per_call=0)
    with pytest.raises(ValueError, match=r"min_p=1.0 \(in \[0, 1\)\)"):
        Engine(config, [1], PAD, min_p=1.0)
    assert engine.idle
