"""Batched autoregressive sampling with a KV cache: one jitted prefill + `lax.while_loop` decode.

Log-probabilities returned with each sampled token are those of the distribution the token was
actually drawn from: `log_softmax(logits / T)` restricted to the top-k tokens, the top-p
nucleus and the min-p floor (`truncate_logits`), renormalised. PPO uses them as behaviour
log-probs, and the learner truncates its own logits the same way (LearnerConfig.top_k, top_p,
min_p). With temperature 1 and no truncation they equal the model's own log-probs
`log_softmax(logits)`. Greedy decoding reports the model's temperature-1 log-prob of the chosen
token.

Shapes are bucketed (prompt length, batch size, max_new_tokens) so that a long run compiles
each bucket once; temperature, top_p, min_p, the exact max_new_tokens and the stop ids are
traced values and never cause a recompile. top_k (a shape), greedy and whether top-p and min-p
are in use are static (a program without them does none of their work).

The KV cache grows while the batch decodes (`cache_phases`): the decode loop runs in phases of
`cache_phase_tokens`, 2x, 4x ... new tokens, each with a cache just long enough for its tokens,
so a step attends over at most twice the slots it has filled instead of prompt + the whole
max_new bucket (a batch that stops early never pays for the long cache). All phases are one
compiled program; the outputs equal one phase's up to float summation order.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax.models import forward, grow_cache, init_cache
from rl4mle_jax.models.presets import Qwen2Config

_NEG_INF = -jnp.inf
# The truncation settings (`truncate_logits`), named alike in SamplingConfig, LearnerConfig,
# `Sampler.generate`, `Engine` and the generation services.
TRUNCATION = ("top_k", "top_p", "min_p")


def truncation_settings(section: Any) -> dict[str, Any]:
    """{top_k, top_p, min_p} of a config section (dataclass or ConfigDict) that has them."""
    return {name: getattr(section, name) for name in TRUNCATION}


@dataclasses.dataclass
class SampleOutput:
    """tokens/logprobs [N, max_new]: entries after a row's stop token hold pad_id / 0.0.

    lengths [N] counts generated tokens including the stop token; prompt_lengths [N].
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    prompt_lengths: np.ndarray

    @property
    def stopped(self) -> np.ndarray:
        """[N] bool: the row ended on a stop token (rather than on max_new_tokens)."""
        return self.lengths < self.tokens.shape[1]


def truncate_logits(x: jax.Array, top_k: int = 0, top_p: jax.Array | float = 1.0,
                    use_top_p: bool = False, min_p: jax.Array | float = 0.0) -> jax.Array:
    """Tempered logits [..., V] with the tokens truncated sampling never draws set to -inf.

    Order as in transformers/vLLM: top-k, then top-p (smallest set of the most likely tokens
    whose mass reaches top_p; the most likely token is always kept), then min-p (tokens whose
    probability is below min_p times the most likely one's; min_p 0 keeps all, and since the
    ratio p / p_max does not change under renormalisation its place in the order does not
    matter). The truncation is a function of the logits alone, so the learner applies this
    same function to its own logits (rl.learner.token_logprobs_and_entropy). min_p as the
    Python number 0 adds no work (a traced min_p always computes its floor).
    """
    x = x.astype(jnp.float32)
    v = x.shape[-1]
    if top_k > 0 and top_k < v:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, _NEG_INF, x)
    if use_top_p:
        logp = jax.nn.log_softmax(x, axis=-1)
        if top_k > 0 and top_k < v:
            sorted_logp = jax.lax.top_k(logp, top_k)[0]  # only k survivors can be in the nucleus
        else:
            sorted_logp = -jnp.sort(-logp, axis=-1)
        p = jnp.exp(sorted_logp)
        mass_before = jnp.cumsum(p, axis=-1) - p
        keep = (mass_before < top_p).at[..., 0].set(True)
        # Threshold = smallest kept log-prob; ties at the threshold are all kept (as in HF).
        threshold = jnp.min(jnp.where(keep, sorted_logp, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(logp < threshold, _NEG_INF, x)
    if isinstance(min_p, jax.Array) or min_p > 0:
        # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p); log(0) = -inf keeps every token.
        floor = jnp.max(x, axis=-1, keepdims=True) + jnp.log(jnp.float32(min_p))
        x = jnp.where(x < floor, _NEG_INF, x)
    return x


def sampling_logprobs(logits_bv: jax.Array, temperature: jax.Array | float, top_k: int = 0,
                      top_p: jax.Array | float = 1.0, use_top_p: bool = False,
                      min_p: jax.Array | float = 0.0) -> jax.Array:
    """Log-probs [B, V] of the sampling distribution (`truncate_logits` of logits / T,
    renormalised); truncated tokens get -inf."""
    x = truncate_logits(logits_bv.astype(jnp.float32) / temperature, top_k, top_p, use_top_p,
                        min_p)
    return jax.nn.log_softmax(x, axis=-1)


def cache_phases(max_new_bucket: int, first: int) -> tuple[int, ...]:
    """The new-token counts at which the decode loop's cache grows: first, 2·first, 4·first ...
    below max_new_bucket, then max_new_bucket (one phase when first is 0 or >= the bucket)."""
    ends, n = [], first
    while 0 < n < max_new_bucket:
        ends.append(n)
        n *= 2
    return (*ends, max_new_bucket)


def _bucket(n: int, buckets: Sequence[int], what: str) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{what}={n} exceeds the largest bucket {buckets[-1]}; "
                         f"truncate it or add a larger bucket")
    return buckets[i]


class Sampler:
    """Generates continuations for batches of token-id prompts (left-padded internally)."""

    def __init__(
        self,
        config: Qwen2Config,
        stop_token_ids: Sequence[int],
        pad_id: int,
        prompt_buckets: Sequence[int] = (64, 128, 256, 512, 1024),
        batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
        max_new_tokens: int = 256,
        new_token_buckets: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
        cache_dtype: str | None = None,
        cache_phase_tokens: int = 128,
        attention_chunk: int | None = None,
    ):
        """attention_chunk: the prefill's causal attention chunk (`models.forward`; None:
        models.qwen2.ATTENTION_CHUNK, 0: one block); decode steps attend in one block."""
        if not stop_token_ids:
            raise ValueError("stop_token_ids is empty; give at least one (e.g. the eos id)")
        for name, b in (("prompt_buckets", prompt_buckets), ("batch_buckets", batch_buckets),
                        ("new_token_buckets", new_token_buckets)):
            if not b or list(b) != sorted(set(b)) or b[0] < 1:
                raise ValueError(f"{name} must be strictly increasing positive ints, got {b}")
        self.config = config
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.pad_id = int(pad_id)
        self.prompt_buckets = tuple(prompt_buckets)
        self.batch_buckets = tuple(batch_buckets)
        self.new_token_buckets = tuple(new_token_buckets)
        self.max_new_tokens = max_new_tokens
        self.cache_dtype = jnp.dtype(cache_dtype or config.dtype)
        if cache_phase_tokens < 0:
            raise ValueError(f"cache_phase_tokens must be >= 0 (0: one phase), got "
                             f"{cache_phase_tokens}")
        self.cache_phase_tokens = int(cache_phase_tokens)
        self.attention_chunk = attention_chunk
        self.num_traces = 0  # incremented each time the decode program is traced (= compiled)
        self._generate_jit = jax.jit(
            self._generate_impl,
            static_argnames=("max_new_bucket", "greedy", "top_k", "use_top_p", "use_min_p"))

    # ------------------------------------------------------------------ traced program
    def _generate_impl(self, params, tokens_bp, mask_bp, done_b, rng, temperature, top_p,
                       min_p, max_new, stop_ids, *, max_new_bucket, greedy, top_k, use_top_p,
                       use_min_p):
        self.num_traces += 1  # Python side effect: runs only while tracing
        cfg = self.config
        b, p = tokens_bp.shape
        phases = cache_phases(max_new_bucket, self.cache_phase_tokens)
        # Step s writes slot p - 1 + s: a phase ending at n new tokens fits in p + n slots.
        cache = init_cache(cfg, b, p + phases[0], self.cache_dtype)
        positions_bp = jnp.maximum(jnp.cumsum(mask_bp, axis=-1) - 1, 0)
        if p > 1:
            # Prefill all but the last prompt column; its logits are unused, so XLA drops the
            # [B, P, V] output layer. The last column (always a real token under left padding)
            # is fed by the first decode step, which yields the first logits.
            _, cache = forward(cfg, params, tokens_bp[:, :-1], positions_bp[:, :-1],
                               mask_bp[:, :-1], cache=cache, cache_index=0,
                               attention_chunk=self.attention_chunk)
        prompt_len_b = jnp.sum(mask_bp, axis=-1).astype(jnp.int32)

        def sample_step(logits_bv, key):
            if greedy:
                tok = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
                logp_bv = jax.nn.log_softmax(logits_bv.astype(jnp.float32), axis=-1)
            else:
                logp_bv = sampling_logprobs(logits_bv, temperature, top_k, top_p, use_top_p,
                                            min_p if use_min_p else 0.0)
                tok = jax.random.categorical(key, logp_bv, axis=-1).astype(jnp.int32)
            return tok, jnp.take_along_axis(logp_bv, tok[:, None], axis=-1)[:, 0]

        def cond(state):
            step, _, _, _, done, _ = state
            return (step < max_new) & ~jnp.all(done)

        def body(state):
            step, cache, cur_b, out, done, lengths = state
            out_tok, out_logp = out
            pos = prompt_len_b + step - 1  # step 0 feeds the last prompt token
            logits, cache = forward(cfg, params, cur_b[:, None], pos[:, None],
                                    jnp.ones((b, 1), mask_bp.dtype), cache=cache,
                                    cache_index=p - 1 + step)
            tok, logp = sample_step(logits[:, -1], jax.random.fold_in(rng, step))
            tok = jnp.where(done, self.pad_id, tok)
            logp = jnp.where(done, 0.0, logp)
            out_tok = jax.lax.dynamic_update_slice(out_tok, tok[:, None], (0, step))
            out_logp = jax.lax.dynamic_update_slice(out_logp, logp[:, None], (0, step))
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | jnp.isin(tok, stop_ids)
            return step + 1, cache, tok, (out_tok, out_logp), done, lengths

        out = (jnp.full((b, max_new_bucket), self.pad_id, jnp.int32),
               jnp.zeros((b, max_new_bucket), jnp.float32))
        state = (jnp.int32(0), cache, tokens_bp[:, -1], out, done_b, jnp.zeros((b,), jnp.int32))
        for end in phases:  # traced once each: one loop per cache length, in one program
            step, cache, *rest = state
            state = (step, grow_cache(cache, p + end), *rest)
            state = jax.lax.while_loop(lambda s, end=end: cond(s) & (s[0] < end), body, state)
        _, _, _, (out_tok, out_logp), _, lengths = state
        return out_tok, out_logp, lengths

    # ------------------------------------------------------------------ host side
    def generate(
        self,
        params,
        prompts: Sequence[Sequence[int]],
        rng: jax.Array,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        stop_token_ids: Sequence[int] | None = None,
        min_p: float = 0.0,
    ) -> SampleOutput:
        """Sample up to `max_new_tokens` per prompt; rows stop at the first stop token.

        Batches larger than the largest batch bucket are split into chunks; temperature 0 means
        greedy; `stop_token_ids` overrides the sampler's for this call (no recompile for up to
        8 ids). Same rng and inputs give the same output.
        """
        stops, max_new, static, temperature = self._settings(
            max_new_tokens, temperature, top_p, top_k, greedy, stop_token_ids, min_p)
        if not prompts:
            raise ValueError("prompts is empty")
        vocab = self.config.vocab_size
        for i, pr in enumerate(prompts):
            if len(pr) == 0:
                raise ValueError(f"prompts[{i}] is empty; a prompt needs at least one token")
            lo, hi = min(pr), max(pr)
            if lo < 0 or hi >= vocab:
                raise ValueError(f"prompts[{i}] has token id {lo if lo < 0 else hi} outside "
                                 f"[0, vocab_size={vocab})")
        chunk = self.batch_buckets[-1]
        outs = [self._generate_chunk(params, prompts[s:s + chunk],
                                     jax.random.fold_in(rng, s // chunk), max_new, temperature,
                                     (top_p, min_p), stops, static)
                for s in range(0, len(prompts), chunk)]
        return SampleOutput(*(np.concatenate(parts) for parts in zip(*(dataclasses.astuple(o)
                                                                      for o in outs))))

    def warm_up(self, params, batch_sizes: Sequence[int], prompt_lengths: Sequence[int],
                rng: jax.Array, max_new_tokens: int | None = None, temperature: float = 1.0,
                top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> int:
        """Compiles the decode program `generate` would call for each batch bucket and prompt
        bucket of the given sizes, with these settings and a key of `rng`'s kind (a raw and a
        typed key are different programs), and runs it for one token (before a clock starts,
        so that the first real calls compile nothing). Returns how many programs were new."""
        stops, _, static, temperature = self._settings(max_new_tokens, temperature, top_p, top_k,
                                                       False, None, min_p)
        traces = self.num_traces
        for b in sorted({_bucket(n, self.batch_buckets, "batch size") for n in batch_sizes}):
            for p in sorted({_bucket(n, self.prompt_buckets, "prompt length")
                             for n in prompt_lengths}):
                # One decode step (the loop bound is an argument; the program is the same).
                self._generate_chunk(params, [[self.pad_id] * p] * b, rng, 1, temperature,
                                     (top_p, min_p), stops, static)
        return self.num_traces - traces

    def _settings(self, max_new_tokens, temperature, top_p, top_k, greedy, stop_token_ids,
                  min_p=0.0):
        """(stop ids padded to a multiple of 8, max_new, the program's static arguments, the
        temperature it is called with) for one call's settings, checked."""
        stops = list(self.stop_token_ids if stop_token_ids is None else stop_token_ids)
        if not stops:
            raise ValueError("stop_token_ids is empty; give at least one (e.g. the eos id)")
        # Pad the id list to a multiple of 8 (repeating an id) so its shape rarely changes.
        stops += stops[:1] * (-len(stops) % 8)
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if temperature < 0 or not 0 < top_p <= 1 or top_k < 0 or not 0 <= min_p < 1:
            raise ValueError(f"bad sampling settings: temperature={temperature} (>= 0), "
                             f"top_p={top_p} (in (0, 1]), top_k={top_k} (>= 0), "
                             f"min_p={min_p} (in [0, 1))")
        greedy = greedy or temperature == 0
        static = dict(
            max_new_bucket=_bucket(max_new, self.new_token_buckets, "max_new_tokens"),
            greedy=bool(greedy),
            top_k=0 if greedy else int(top_k),
            use_top_p=bool(not greedy and top_p < 1.0),
            use_min_p=bool(not greedy and min_p > 0.0))
        return stops, max_new, static, 1.0 if greedy else temperature

    def _generate_chunk(self, params, prompts, rng, max_new, temperature, truncation, stops,
                        static):
        n = len(prompts)
        b = _bucket(n, self.batch_buckets, "batch size")
        p = _bucket(max(len(x) for x in prompts), self.prompt_buckets, "prompt length")
        tokens = np.full((b, p), self.pad_id, np.int32)
        mask = np.zeros((b, p), np.int32)
        for i, pr in enumerate(prompts):
            tokens[i, p - len(pr):] = pr
            mask[i, p - len(pr):] = 1
        mask[n:, -1] = 1  # filler rows: one real token, marked done from the start
        done = np.arange(b) >= n
        top_p, min_p = truncation
        out_tok, out_logp, lengths = self._generate_jit(
            params, tokens, mask, done, rng, jnp.float32(temperature), jnp.float32(top_p),
            jnp.float32(min_p), jnp.int32(max_new), jnp.asarray(stops, jnp.int32), **static)
        out_tok, out_logp, lengths = jax.device_get((out_tok, out_logp, lengths))
        return SampleOutput(
            tokens=np.asarray(out_tok[:n, :max_new], np.int32),
            logprobs=np.asarray(out_logp[:n, :max_new], np.float32),
            lengths=np.asarray(lengths[:n], np.int32),
            prompt_lengths=np.asarray([len(x) for x in prompts], np.int32))

