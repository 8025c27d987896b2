"""Generation service on the continuous-batching engine: a drop-in for `GenerationService`.

Same surface (`start()`, `await stop()`, `await generate(prompt_ids) -> Generation`), but a
request enters a free decode slot at the next engine step instead of waiting for a merged
batch to form and then for that batch's longest member. The engine steps in jobs on the device
lane of at most `max_slice_s` each, so the learner's train steps interleave with decoding;
within a job, new requests are admitted and finished ones handed back to the event loop at
every step (a thread hop per step instead costs milliseconds on a busy machine). `get_params`
is read before every step: a new policy version is used from the next engine call on (the
next token when `steps_per_call` is 1).

Which version a response reports: `params_version` is the oldest among its tokens (its first
token's, as versions only grow), so the loop's staleness (current version - params_version) is never
understated; `token_versions` has the version of every token. The log-probs are exact per
token either way (each is the probability the token was drawn with).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl4mle_jax.engine import Engine
from rl4mle_jax.rollout.service import BusySpans, Generation


@dataclasses.dataclass
class EngineGeneration(Generation):
    """A `Generation` plus the weights version of each response token."""

    token_versions: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    key: jax.Array
    future: asyncio.Future


class EngineService:
    """Serves `generate(prompt_ids)` for one parameter set (policy or frozen copy).

    Args:
      engine: a `rl4mle_jax.engine.Engine` owned by this service (its slots hold our requests).
      get_params: returns `(params, version)`; read before every engine step.
      device_lane: the executor device work runs on (share one between services and learner).
      rng: seeds the host generator that draws each request's key (no device op per
        request); a request's tokens depend on its key alone.
      max_new_tokens, temperature: per-request settings this service uses (the engine's
        limit by default; temperature 0 = greedy). top_k/top_p/min_p, if given, must equal the
        engine's: they are fixed when it compiles.
      max_slice_s: longest stretch of steps per device-lane job (others wait that long at most).
      busy: where the lane's engine jobs are recorded (share it with the lane), as
        `GenerationService` does, so the sampler's idle fraction during learning is measured.
      max_batch, max_wait_s: accepted for `GenerationService` compatibility and unused (the
        batch is the engine's slots, and nothing waits for a batch to form).
    """

    def __init__(
        self,
        engine: Engine,
        get_params: Callable[[], tuple[Any, int]],
        device_lane: concurrent.futures.Executor,
        rng: jax.Array,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        max_slice_s: float = 0.1,
        max_batch: int | None = None,
        max_wait_s: float | None = None,
        busy: BusySpans | None = None,
    ):
        del max_batch, max_wait_s
        for name, want in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p)):
            have = getattr(engine, name)
            if want is not None and want != have:
                raise ValueError(f"{name}={want} differs from the engine's {name}={have}; "
                                 f"build the Engine with {name}={want}")
        self.engine = engine
        self.get_params = get_params
        self.device_lane = device_lane
        self.max_new_tokens = engine.max_new_tokens if max_new_tokens is None else max_new_tokens
        self.temperature = temperature
        self.max_slice_s = max_slice_s
        self.busy = BusySpans() if busy is None else busy
        engine.check_request([0], self.max_new_tokens, temperature)
        if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
            rng = jax.random.key_data(rng)
        self._keys = np.random.default_rng(np.asarray(rng, np.uint32).ravel().tolist())
        self._lock = threading.Lock()  # guards _keys and _inbox (event loop vs device lane)
        self._inbox: list[_Request] = []
        self._futures: dict[int, asyncio.Future] = {}  # touched by the device lane only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._work: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._job: concurrent.futures.Future | None = None  # the lane job, if one runs
        self._stopping = False
        self.steps = 0
        self.requests = 0
        self.busy_s = 0.0  # seconds of engine steps on the lane (what this service cost it)
        self.tokens = 0  # generated tokens of finished requests

    def warm_up(self, prompt_lengths: Sequence[int]) -> int:
        """Compiles every engine program (each prompt bucket; the lengths are not needed) on
        the calling thread with the current params: `Engine.warmup`. Returns how many programs
        were new to the engine (traced)."""
        del prompt_lengths
        before = sum(self.engine.num_traces.values())
        self.engine.warmup(self.get_params()[0])
        return sum(self.engine.num_traces.values()) - before

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._work = asyncio.Event()
        self._stopping = False
        self._worker = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        """Stops serving; requests still waiting are cancelled."""
        self._stopping = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        if self._job is not None:  # a job on the lane ends at its next step; wait for it
            await asyncio.gather(asyncio.wrap_future(self._job), return_exceptions=True)
            self._job = None
        with self._lock:
            waiting = [r.future for r in self._inbox] + list(self._futures.values())
            self._inbox.clear()
        for future in waiting:
            future.cancel()
        self._futures.clear()
        self.engine.reset()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None
                       ) -> Generation:
        """One response (up to this service's max_new_tokens unless given); cancelling the await
        (e.g. a timeout) frees the request's slot at the next step."""
        if self._work is None:
            raise RuntimeError("EngineService.start() must be called inside the event loop")
        prompt = [int(t) for t in prompt_ids]
        max_new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        self.engine.check_request(prompt, max_new, self.temperature)
        future = self._loop.create_future()
        with self._lock:
            key = self._keys.integers(0, 2**32, 2, dtype=np.uint32)
            self._inbox.append(_Request(prompt, max_new, key, future))
        self._work.set()
        return await future

    async def _serve(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()  # before the job looks at the inbox: later arrivals set it again
            self._job = self.device_lane.submit(self._run_busy)
            await asyncio.wrap_future(self._job)
            self._job = None
            if not self.engine.idle:
                self._work.set()

    # ------------------------------------------------------------- on the device lane
    def _admit(self) -> None:
        """Takes new requests into the engine and drops the ones whose caller gave up."""
        with self._lock:
            new, self._inbox = self._inbox, []
        for req in new:
            if not req.future.done():
                rid = self.engine.submit(req.prompt_ids, req.key, req.max_new_tokens,
                                         self.temperature)
                self._futures[rid] = req.future
        # done() here means cancelled (only the event loop settles futures, after we pop them);
        # reading it from this thread is a plain attribute read.
        for rid in [rid for rid, f in self._futures.items() if f.done()]:
            self.engine.cancel(rid)
            del self._futures[rid]

    def _run_busy(self) -> None:
        t0 = time.perf_counter()
        try:
            with self.busy.busy():
                self._run()
        finally:
            self.busy_s += time.perf_counter() - t0

    def _run(self) -> None:
        """Steps until idle or the slice ends, handing each result to the event loop."""
        end = time.perf_counter() + self.max_slice_s
        while not self._stopping and time.perf_counter() < end:
            self._admit()
            if self.engine.idle:
                return
            try:
                params, version = self.get_params()
                done = self.engine.step(params, version)
            except Exception as e:  # surface to every waiting episode, keep serving
                for rid in self.engine.reset():
                    future = self._futures.pop(rid, None)
                    if future is not None:
                        self._loop.call_soon_threadsafe(_settle, future, None, e)
                continue
            self.steps += 1
            for c in done:
                self.requests += 1
                self.tokens += len(c.tokens)
                future = self._futures.pop(c.request_id, None)
                if future is not None:
                    gen = EngineGeneration(c.prompt_ids, c.tokens, c.logprobs, c.stopped,
                                           min(c.versions), token_versions=c.versions)
                    self._loop.call_soon_threadsafe(_settle, future, gen, None)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if not future.done():  # the caller may have given up meanwhile
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
