"""Continuous-batching generation: a fixed set of decode slots that requests enter and leave.

JetStream's shape. A request's prompt is *prefilled* alone (length bucketed) into a small KV
cache, *inserted* into a free slot of the engine's [slots, S] cache, and then one jitted
*generate* step advances every active slot by one token. A slot frees itself at a stop token
or at its request's own `max_new_tokens`, and the host refills it from the queue before the
next step: short responses never wait for long ones, and a request that arrives mid-decode
waits one step, not a whole batch (the static `Sampler` makes it wait for the longest member).

Cache layout: slot b keeps its sequence at cache rows [0, n) with cache row == position, no
padding in front; the model's per-row `cache_index` writes each slot's next key at its own
length, and the cache mask hides rows a slot has not written (or an earlier request left).

Randomness is per request: token i of a request is drawn with `fold_in(request_key, i)`, so
its tokens do not depend on its slot, its neighbours or when it was inserted.

Log-probs are those of `Sampler`: of the distribution the token was drawn from
(`sampling_logprobs`, engine-wide top_k/top_p/min_p); greedy requests (temperature 0) report the
model's temperature-1 log-prob.

Weights: `step(params, version)` takes the weights for that step and tags each token it makes
with `version`. A response that spans an update keeps decoding under the new weights, over
keys and values the old weights computed (they stay in the cache): each token's log-prob is
still exactly the probability it was drawn with, which is what PPO's importance ratio needs,
and no work is thrown away (restarting it would waste the tokens; pinning it to old weights
would need a second parameter set on the device).

Steps per call: with `steps_per_call=k` one jitted call runs k generate steps (a `lax.scan`)
and the host reads their tokens once, instead of once per token. On an accelerator the per-token
host round trip and launch overhead dominate small-batch decode (H200, 0.5B, bfloat16: 3.6 ms
per token step one at a time, 1.5 ms in a scan of 32; scripts/bench_decode_dispatch.py). The
price: a slot that finishes inside a call stays idle until the call ends (at most k - 1 steps),
and a queued request waits up to k steps for a slot. Tokens do not depend on k (each slot's
draws are keyed by its own request and position), and a finished slot stops in the scan
exactly where a single step would stop it.

Compiles: prefill and insert once per prompt bucket, generate once; every value that changes
between requests (prompt, length, slot, temperature, limit, key, stop ids) is traced.
`num_traces` counts traces per program and logs each; `backend_compiles()` counts every XLA
compile in the process, which stays flat over a warm engine's steps.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax.models import KVCache, forward, init_cache
from rl4mle_jax.models.presets import Qwen2Config
from rl4mle_jax.sampling import _bucket, sampling_logprobs

log = logging.getLogger(__name__)

# XLA compilations in this process (every jit, eager op and engine program), from jax's own
# compile event: a compile that no re-trace explains (e.g. new input shardings) shows up here.
_compiles = collections.Counter()


def _on_event(event: str, duration_s: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles["backend"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def backend_compiles() -> int:
    """XLA compilations in this process so far; unchanged over a warm engine's steps."""
    return _compiles["backend"]


class SlotState(NamedTuple):
    """Device state of all slots; every field but the cache is [B] (B = number of slots)."""

    cache: KVCache  # k, v per layer [B, S, nKV, D]; mask [B, S]
    tokens: jax.Array  # int32: the token each slot feeds next (its last one)
    lengths: jax.Array  # int32: cache row (= position) of `tokens`
    generated: jax.Array  # int32: tokens sampled so far by the slot's request
    max_new: jax.Array  # int32: the request's own limit
    temperature: jax.Array  # float32; 0 = greedy
    keys: jax.Array  # uint32 [B, 2]: the request's key data
    active: jax.Array  # bool: still decoding


@dataclasses.dataclass
class Completion:
    """A finished request; steps count engine generate steps (for latency and order checks)."""

    request_id: int
    prompt_ids: list[int]
    tokens: list[int]  # up to and including the stop token
    logprobs: list[float]
    versions: list[int]  # weights version that produced each token
    stopped: bool  # ended on a stop token (False: its max_new_tokens)
    slot: int
    insert_step: int
    finish_step: int


@dataclasses.dataclass
class _Request:
    request_id: int
    prompt_ids: list[int]
    key_data: np.ndarray  # uint32 [2]
    max_new_tokens: int
    temperature: float
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    insert_step: int = -1


# ------------------------------------------------------------------------- pure programs
def init_slots(config: Qwen2Config, num_slots: int, max_len: int, cache_dtype: Any) -> SlotState:
    """All slots empty and inactive."""
    # One buffer per field: the state is donated, and a buffer cannot be donated twice.
    zeros = lambda dtype=jnp.int32: jnp.zeros((num_slots,), dtype)  # noqa: E731
    return SlotState(init_cache(config, num_slots, max_len, cache_dtype), zeros(), zeros(),
                     zeros(), zeros(), jnp.ones((num_slots,), jnp.float32),
                     jnp.zeros((num_slots, 2), jnp.uint32), zeros(bool))


def prefill(config: Qwen2Config, cache_dtype: Any, params, tokens_p: jax.Array,
            length: jax.Array) -> KVCache:
    """KV cache [1, P] of the first `length` tokens of a right-padded row (logits unused, so
    XLA drops the output layer)."""
    p = tokens_p.shape[0]
    positions = jnp.arange(p)[None]
    mask = (positions < length).astype(jnp.int32)
    cache = init_cache(config, 1, p, cache_dtype)
    return forward(config, params, tokens_p[None], positions, mask, cache=cache,
                   cache_index=0)[1]


def insert(state: SlotState, prefix: KVCache, slot, last_token, length, max_new, temperature,
           key_data) -> SlotState:
    """Puts a prefilled prompt into `slot`: its keys at rows [0, P), the rest of the row masked.

    `last_token` (the prompt's last, not in `prefix`) is fed by the next generate step, which
    yields the request's first token, as in `Sampler`.
    """
    row = jnp.zeros_like(state.cache.mask[0]).at[:prefix.mask.shape[1]].set(prefix.mask[0])
    put = lambda dst, src: jax.lax.dynamic_update_slice(  # noqa: E731
        dst, src.astype(dst.dtype), (slot,) + (0,) * (dst.ndim - 1))
    cache = KVCache(tuple(put(d, s) for d, s in zip(state.cache.k, prefix.k)),
                    tuple(put(d, s) for d, s in zip(state.cache.v, prefix.v)),
                    state.cache.mask.at[slot].set(row))
    return SlotState(cache, state.tokens.at[slot].set(last_token),
                     state.lengths.at[slot].set(length), state.generated.at[slot].set(0),
                     state.max_new.at[slot].set(max_new),
                     state.temperature.at[slot].set(temperature),
                     state.keys.at[slot].set(key_data), state.active.at[slot].set(True))


def generate(config: Qwen2Config, params, state: SlotState, stop_ids: jax.Array, *,
             top_k: int, top_p: float, min_p: float = 0.0) -> tuple[SlotState, jax.Array]:
    """Advances every active slot by one token.

    Returns (state, out [3, B] float32): the token (exact: ids < 2**24), its log-prob, and
    whether the slot is still active; one array, so the host makes one transfer per step.
    """
    logits, cache = forward(config, params, state.tokens[:, None], state.lengths[:, None],
                            cache=state.cache, cache_index=state.lengths)
    logits_bv = logits[:, 0]
    greedy = state.temperature == 0
    temperature = jnp.where(greedy, 1.0, state.temperature)[:, None]
    logp_bv = sampling_logprobs(logits_bv, temperature, top_k, top_p, top_p < 1.0, min_p)
    keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(state.keys), state.generated)
    sampled = jax.vmap(jax.random.categorical)(keys, logp_bv)
    tok = jnp.where(greedy, jnp.argmax(logits_bv, axis=-1), sampled).astype(jnp.int32)
    pick = lambda lp: jnp.take_along_axis(lp, tok[:, None], axis=-1)[:, 0]  # noqa: E731
    logp = jnp.where(greedy, pick(jax.nn.log_softmax(logits_bv, axis=-1)), pick(logp_bv))
    active = state.active
    generated = state.generated + active
    still = active & ~(jnp.isin(tok, stop_ids) | (generated >= state.max_new))
    state = SlotState(cache, jnp.where(active, tok, state.tokens), state.lengths + active,
                      generated, state.max_new, state.temperature, state.keys, still)
    return state, jnp.stack([tok.astype(jnp.float32), logp, still.astype(jnp.float32)])


def generate_steps(config: Qwen2Config, params, state: SlotState, stop_ids: jax.Array, *,
                   steps: int, top_k: int, top_p: float, min_p: float = 0.0
                   ) -> tuple[SlotState, jax.Array]:
    """`steps` generate steps in one program; out [steps, 3, B] (row i: step i's `generate`
    output). A slot that stops at step i is inactive after it: it neither advances nor samples
    into its state, and its later rows are to be ignored."""
    step = functools.partial(generate, config, top_k=top_k, top_p=top_p, min_p=min_p)
    return jax.lax.scan(lambda s, _: step(params, s, stop_ids), state, None, length=steps)


# ------------------------------------------------------------------------- host side
class Engine:
    """Serves token-id requests through `num_slots` decode slots (one parameter set per call).

    Host-side and single-threaded: `submit` queues, `step(params, version)` inserts queued
    requests into free slots, runs one generate call (`steps_per_call` token steps) and returns
    the requests that finished.

    Args:
      prompt_buckets: prompt lengths are padded up to one of these (one prefill compile each).
      max_new_tokens: the largest per-request limit; with the largest prompt bucket it sizes
        the cache (S = prompt_buckets[-1] + max_new_tokens).
      top_k, top_p, min_p: engine-wide truncation (top_k is a shape, so per request would
        recompile).
      steps_per_call: token steps per jitted call, read back together (module docstring: 1
        suits a CPU, where a step's compute dwarfs its host round trip; 8-32 an accelerator).
    """

    def __init__(self, config: Qwen2Config, stop_token_ids: Sequence[int], pad_id: int,
                 num_slots: int = 8,
                 prompt_buckets: Sequence[int] = (64, 128, 256, 512, 1024),
                 max_new_tokens: int = 256, top_k: int = 0, top_p: float = 1.0,
                 cache_dtype: str | None = None, steps_per_call: int = 1, min_p: float = 0.0):
        if not stop_token_ids:
            raise ValueError("stop_token_ids is empty; give at least one (e.g. the eos id)")
        if not prompt_buckets or list(prompt_buckets) != sorted(set(prompt_buckets)) \
                or prompt_buckets[0] < 1:
            raise ValueError(f"prompt_buckets must be strictly increasing positive ints, "
                             f"got {prompt_buckets}")
        if num_slots < 1 or max_new_tokens < 1 or steps_per_call < 1:
            raise ValueError(f"num_slots={num_slots}, max_new_tokens={max_new_tokens} and "
                             f"steps_per_call={steps_per_call} must be >= 1")
        if config.vocab_size > 2**24:
            raise ValueError(f"vocab_size={config.vocab_size} > 2**24: token ids would not "
                             f"survive the float32 step output")
        if top_k < 0 or not 0 < top_p <= 1 or not 0 <= min_p < 1:
            raise ValueError(f"bad sampling settings: top_k={top_k} (>= 0), "
                             f"top_p={top_p} (in (0, 1]), min_p={min_p} (in [0, 1))")
        self.config = config
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.pad_id = int(pad_id)
        self.num_slots = num_slots
        self.prompt_buckets = tuple(prompt_buckets)
        self.max_new_tokens = max_new_tokens
        self.top_k, self.top_p, self.min_p = int(top_k), float(top_p), float(min_p)
        self.cache_dtype = jnp.dtype(cache_dtype or config.dtype)
        self.max_len = self.prompt_buckets[-1] + max_new_tokens
        stops = list(self.stop_token_ids)
        self._stop_ids = np.asarray(stops + stops[:1] * (-len(stops) % 8), np.int32)
        self.num_traces: collections.Counter[str] = collections.Counter()
        self._prefill = jax.jit(self._counted("prefill", functools.partial(
            prefill, config, self.cache_dtype)))
        self._insert = jax.jit(self._counted("insert", insert), donate_argnums=0)
        self.steps_per_call = int(steps_per_call)
        self._generate = jax.jit(self._counted("generate", functools.partial(
            generate_steps, config, steps=self.steps_per_call, top_k=self.top_k,
            top_p=self.top_p, min_p=self.min_p)), donate_argnums=1)
        self.steps = 0  # generate steps run (tokens per slot), the engine's clock
        self._next_id = 0
        self._pending: collections.deque[_Request] = collections.deque()
        self._slots: list[_Request | None] = [None] * num_slots
        self._state = init_slots(config, num_slots, self.max_len, self.cache_dtype)

    def _counted(self, name: str, fn):
        @functools.wraps(fn)
        def traced(*args, **kwargs):  # the body runs only while jax traces, i.e. compiles
            self.num_traces[name] += 1
            log.info("engine: compiling %s (trace %d)", name, self.num_traces[name])
            return fn(*args, **kwargs)
        return traced

    # --------------------------------------------------------------------- queue
    @property
    def num_active(self) -> int:
        return sum(r is not None for r in self._slots)

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def idle(self) -> bool:
        return not self._pending and not self.num_active

    def check_request(self, prompt_ids: Sequence[int], max_new_tokens: int,
                      temperature: float) -> None:
        """Raises ValueError on a request the engine cannot serve (before it is queued)."""
        if len(prompt_ids) == 0:
            raise ValueError("prompt is empty; a prompt needs at least one token")
        lo, hi = min(prompt_ids), max(prompt_ids)
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"prompt has token id {lo if lo < 0 else hi} outside "
                             f"[0, vocab_size={self.config.vocab_size})")
        _bucket(len(prompt_ids), self.prompt_buckets, "prompt length")
        if not 1 <= max_new_tokens <= self.max_new_tokens:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be in "
                             f"[1, engine max_new_tokens={self.max_new_tokens}]")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")

    def submit(self, prompt_ids: Sequence[int], key: jax.Array,
               max_new_tokens: int | None = None, temperature: float = 1.0) -> int:
        """Queues a request; returns its id. `key` (a jax key or raw uint32 [2] key data) alone
        decides its random draws."""
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        prompt = [int(t) for t in prompt_ids]
        self.check_request(prompt, max_new, temperature)
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        rid = self._next_id
        self._next_id += 1
        self._pending.append(_Request(rid, prompt, np.asarray(key, np.uint32), max_new,
                                      float(temperature)))
        return rid

    def cancel(self, request_id: int) -> bool:
        """Drops a queued or running request (its slot is refilled at the next step)."""
        for r in self._pending:
            if r.request_id == request_id:
                self._pending.remove(r)
                return True
        for i, r in enumerate(self._slots):
            if r is not None and r.request_id == request_id:
                self._slots[i] = None  # the device row decodes on unseen until overwritten
                return True
        return False

    def reset(self) -> list[int]:
        """Forgets every request (after a failed step); returns their ids."""
        ids = [r.request_id for r in self._pending] + [r.request_id for r in self._slots if r]
        self._pending.clear()
        self._slots = [None] * self.num_slots
        self._state = init_slots(self.config, self.num_slots, self.max_len, self.cache_dtype)
        return ids

    # --------------------------------------------------------------------- device work
    def _insert_request(self, params, slot: int, req: _Request) -> None:
        n = len(req.prompt_ids)
        tokens = np.full((_bucket(n, self.prompt_buckets, "prompt length"),), self.pad_id,
                         np.int32)
        tokens[:n - 1] = req.prompt_ids[:-1]
        prefix = self._prefill(params, tokens, np.int32(n - 1))
        self._state = self._insert(self._state, prefix, np.int32(slot),
                                   np.int32(req.prompt_ids[-1]), np.int32(n - 1),
                                   np.int32(req.max_new_tokens), np.float32(req.temperature),
                                   req.key_data)
        req.insert_step = self.steps
        self._slots[slot] = req

    def step(self, params, version: int = 0) -> list[Completion]:
        """Fills free slots from the queue, advances every slot, returns what finished."""
        for slot in range(self.num_slots):
            if self._slots[slot] is None and self._pending:
                self._insert_request(params, slot, self._pending.popleft())
        if not self.num_active:
            return []
        self._state, out = self._generate(params, self._state, self._stop_ids)
        done = []
        for tokens, logprobs, still in np.asarray(jax.device_get(out)).tolist():
            self.steps += 1
            for slot, req in enumerate(self._slots):
                if req is None:  # free, finished earlier in this call, or cancelled
                    continue
                req.tokens.append(int(tokens[slot]))
                req.logprobs.append(logprobs[slot])
                req.versions.append(int(version))
                if not still[slot]:
                    self._slots[slot] = None
                    done.append(Completion(
                        req.request_id, req.prompt_ids, req.tokens, req.logprobs,
                        req.versions, req.tokens[-1] in self.stop_token_ids, slot,
                        req.insert_step, self.steps))
        return done

    def run(self, params, version: int = 0) -> list[Completion]:
        """Steps until every queued and running request is done; completions in finish order."""
        out = []
        while not self.idle:
            out += self.step(params, version)
        return out

    def warmup(self, params) -> None:
        """Compiles every program (each prompt bucket) on a scratch state; needs an idle engine."""
        if not self.idle:
            raise RuntimeError("warmup needs an idle engine (it replaces the slot state)")
        for p in self.prompt_buckets:
            prefix = self._prefill(params, np.zeros((p,), np.int32), np.int32(0))
            self._state = self._insert(self._state, prefix, np.int32(0), np.int32(0),
                                       np.int32(0), np.int32(1), np.float32(1),
                                       np.zeros((2,), np.uint32))
        self._state = self._generate(params, self._state, self._stop_ids)[0]
        jax.block_until_ready(self._state)
        self._state = init_slots(self.config, self.num_slots, self.max_len, self.cache_dtype)
