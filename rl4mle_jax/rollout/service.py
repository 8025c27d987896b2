"""Generation service: batches sampling requests from concurrent episodes onto the devices.

Episodes call `await service.generate(prompt_ids)`; the service gathers the requests that
arrive within `max_wait_s` (up to `max_batch`) into one call of the bucketed, jitted sampler,
so K concurrent episodes cost one device call rather than K. The device work runs on a
single-thread executor (a "device lane"), so the event loop, and with it every sandbox
execution, keeps going while the devices sample or train. With one mesh the lane is shared
with the learner (sampling waits while a train step runs); with the devices split
(`mesh.sampler_devices`) the sampler has a lane of its own and never waits for the learner.
Params are read once per batched call (`get_params`), so new versions are picked up between
requests.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass
class Generation:
    """One sampled response."""

    prompt_ids: list[int]
    response_ids: list[int]  # sampled tokens up to and including the stop token
    logprobs: list[float]  # behaviour log-probs of response_ids under the sampling distribution
    stopped: bool  # ended on a stop token (False: hit max_new_tokens)
    params_version: int


class BusySpans:
    """When a device lane ran sampler calls: the sampler's idle fraction during learning.

    Services that share a lane share one of these (perf_counter seconds; the last `keep`
    calls are remembered, plenty for the span of one train step).
    """

    def __init__(self, keep: int = 4096):
        self._spans: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)
        self._open: float | None = None  # start of the call running now
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        start = time.perf_counter()
        with self._lock:
            self._open = start
        try:
            yield
        finally:
            with self._lock:
                self._spans.append((start, time.perf_counter()))
                self._open = None

    def busy_s(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which a sampler call ran."""
        with self._lock:
            spans = list(self._spans)
            if self._open is not None:
                spans.append((self._open, time.perf_counter()))
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)

    def idle_frac(self, t0: float, t1: float) -> float:
        """Share of [t0, t1] without a sampler call (idle for want of requests counts too)."""
        return 1.0 - self.busy_s(t0, t1) / (t1 - t0) if t1 > t0 else 0.0


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    future: asyncio.Future


class GenerationService:
    """Serves `generate(prompt_ids)` for one parameter set (policy or frozen copy).

    Args:
      sampler: a `rl4mle_jax.sampling.Sampler`.
      get_params: returns `(params, version)`; read once per batched call (so each Generation
        carries the version that produced all its tokens) and new policy versions are picked
        up as soon as the learner publishes them (`rollout.publish.WeightPublisher.latest`).
      device_lane: the executor device work runs on (the learner's with one mesh, the
        sampler's own with split devices; services on the same devices share one).
      busy: where the lane's sampler calls are recorded (share it with the lane).
      sampling: keyword arguments for `sampler.generate` (temperature, top_p, top_k, ...).
    """

    def __init__(
        self,
        sampler: Any,
        get_params: Callable[[], tuple[Any, int]],
        device_lane: concurrent.futures.Executor,
        rng: jax.Array,
        max_batch: int = 8,
        max_wait_s: float = 0.05,
        busy: BusySpans | None = None,
        **sampling: Any,
    ):
        self.sampler = sampler
        self.busy = BusySpans() if busy is None else busy
        self.get_params = get_params
        self.device_lane = device_lane
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.sampling = sampling
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self.calls = 0
        self.requests = 0
        self.busy_s = 0.0  # seconds of sampler calls on the lane (what this service cost it)
        self.tokens = 0  # generated tokens, stop tokens included

    def _next_rng(self) -> jax.Array:
        with self._rng_lock:
            self._rng, key = jax.random.split(self._rng)
        return key

    def warm_up(self, prompt_lengths: Sequence[int]) -> int:
        """Compiles, on the calling thread, the programs this service's calls can need (every
        merged batch size up to max_batch, each prompt length's bucket) with the current
        params: `Sampler.warm_up`. Returns how many were new."""
        params, _ = self.get_params()
        return self.sampler.warm_up(params, range(1, self.max_batch + 1), prompt_lengths,
                                    self._rng, **self.sampling)  # its kind of key, not a draw

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    async def generate(self, prompt_ids: list[int]) -> Generation:
        if self._queue is None:
            raise RuntimeError("GenerationService.start() must be called inside the event loop")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(list(prompt_ids), future))
        return await future

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_s
            while len(batch) < self.max_batch:
                if not self._queue.empty():  # already waiting: take it (wait_for(…, 0)
                    batch.append(self._queue.get_nowait())  # would time out first)
                    continue
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(),
                                                        max(deadline - loop.time(), 0)))
                except asyncio.TimeoutError:
                    break
            try:
                results = await loop.run_in_executor(self.device_lane, self._sample, batch)
            except Exception as e:  # surface to every waiting episode, keep serving
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(e)
                continue
            for req, result in zip(batch, results):
                if not req.future.done():
                    req.future.set_result(result)

    def _sample(self, batch: list[_Request]) -> list[Generation]:
        params, version = self.get_params()
        t0 = time.perf_counter()
        with self.busy.busy():
            out = self.sampler.generate(params, [r.prompt_ids for r in batch], self._next_rng(),
                                        **self.sampling)
            tokens = np.asarray(out.tokens)
            logprobs = np.asarray(out.logprobs)
            lengths = np.asarray(out.lengths)
        self.busy_s += time.perf_counter() - t0
        self.calls += 1
        self.requests += len(batch)
        self.tokens += int(lengths.sum())
        gens = []
        for i, req in enumerate(batch):
            n = int(lengths[i])
            ids = tokens[i, :n].tolist()
            stopped = bool(n and ids[-1] in set(self.sampler.stop_token_ids))
            gens.append(Generation(req.prompt_ids, ids, logprobs[i, :n].astype(float).tolist(),
                                   stopped, version))
        return gens
