"""Asynchronous rollout pool: K episodes in flight, finished ones queued in completion order.

The pool is host-side asyncio and knows nothing of JAX or sandboxes: an episode is any
coroutine function `run_episode(request) -> result`. What matters for the paper's argument is
that fast episodes really do come back first and more often; the queue preserves that order and
the pool measures how busy its slots were, beside what a synchronous loop (start K, wait for
the slowest, repeat) would have achieved on the same durations.

Admission control: with an `admit` callback, a free slot starts its next episode only when
`admit()` says so (the loop's staleness bound); otherwise the slot waits, idle, until `wake()`
(called after the learner consumed a batch). Waiting slots, never discarded episodes, are how
the bound is kept; the idle time is counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any


@dataclasses.dataclass
class Finished:
    """One finished episode as the learner sees it."""

    episode_id: int
    slot: int
    request: Any
    result: Any  # what run_episode returned, or None when it raised
    error: str | None  # "<ExcType>: message" when run_episode raised
    started_at: float  # wall-clock (time.time()) at which the slot started the episode
    finished_at: float
    duration_s: float  # the result's own `duration_s` (e.g. sandbox time), else the episode's


@dataclasses.dataclass
class SlotStats:
    """Slot utilisation: busy time over K * wall-clock, and the synchronous counterfactual."""

    num_slots: int
    wall_s: float
    duration_s: float  # the finished episodes' duration_s, summed: the slots' busy time
    episodes: int
    sync_wall_s: float  # wall-clock a start-K-wait-for-slowest loop needs for the same episodes
    admission_idle_s: float = 0.0  # slot-seconds spent waiting for admission

    @property
    def admission_idle_frac(self) -> float:
        return self.admission_idle_s / max(self.num_slots * self.wall_s, 1e-9)

    @property
    def utilisation(self) -> float:
        return self.duration_s / max(self.num_slots * self.wall_s, 1e-9)

    @property
    def sync_utilisation(self) -> float:
        return self.duration_s / max(self.num_slots * self.sync_wall_s, 1e-9)

    def to_dict(self) -> dict[str, float]:
        return {
            "slots": self.num_slots,
            "wall_s": self.wall_s,
            "duration_s": self.duration_s,
            "episodes": self.episodes,
            "utilisation": self.utilisation,
            "sync_wall_s": self.sync_wall_s,
            "sync_utilisation": self.sync_utilisation,
            "admission_idle_s": self.admission_idle_s,
            "admission_idle_frac": self.admission_idle_frac,
        }


def sync_wall_time(durations: list[float], num_slots: int) -> float:
    """Wall-clock of a synchronous loop that runs episodes K at a time and waits for the slowest."""
    return sum(max(durations[i:i + num_slots]) for i in range(0, len(durations), num_slots))


class RolloutPool:
    """Keeps `num_slots` episodes running; `get_batch(B)` returns B finished ones, fastest first.

    Args:
      run_episode: coroutine function taking a request and returning a result. If the result
        has a `duration_s` attribute or key, that is counted as slot-busy time (e.g. the
        program's sandbox time); otherwise the whole episode counts.
      make_request: called (synchronously) each time a slot frees up, with the episode id; it
        may read the latest policy version, so requests reflect the current policy.
      num_slots: K, the number of concurrent episodes.
      admit: called before each start; False leaves the slot idle until `wake()`.
    """

    def __init__(
        self,
        run_episode: Callable[[Any], Awaitable[Any]],
        make_request: Callable[[int], Any],
        num_slots: int,
        first_episode_id: int = 0,
        admit: Callable[[], bool] | None = None,
    ):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self._run_episode = run_episode
        self._make_request = make_request
        self.num_slots = num_slots
        self._queue: asyncio.Queue[Finished] = asyncio.Queue()
        self._ids = itertools.count(first_episode_id)
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._t0: float | None = None
        self._duration_s = 0.0  # summed Finished.duration_s
        self._durations: dict[int, float] = {}  # episode id -> seconds
        self._admit = admit
        self._idle: dict[int, float] = {}  # slot -> time it started waiting for admission
        self._idle_s = 0.0  # slot-seconds spent waiting for admission
        self._running: dict[int, tuple[float, Any]] = {}  # episode id -> (started_at, request)
        self.started = 0  # episodes started

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Fill every slot; call from inside the running event loop."""
        self._t0 = time.time()
        for slot in range(self.num_slots):
            self._launch(slot)

    async def stop(self) -> list[dict[str, Any]]:
        """Stop refilling slots and cancel the episodes still in flight; returns those
        (episode id, request kind, started_at, elapsed_s: their Δt is censored there)."""
        self._stopping = True
        now = time.time()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        # Read after the tasks are done: an episode can still end normally while it is being
        # cancelled (one that swallows the cancellation, as asyncio.wait_for does when its
        # inner future completes at the same moment, Python <= 3.11); it is then in the queue
        # for drain(), and must not be reported as cancelled too.
        cancelled = [{"episode_id": eid, "kind": _kind(req), "started_at": t0,
                      "elapsed_s": now - t0} for eid, (t0, req) in sorted(self._running.items())]
        self._running.clear()
        self._idle_s += sum(now - t for t in self._idle.values())
        self._idle.clear()
        return cancelled

    def wake(self) -> None:
        """Start an episode in each slot waiting for admission, while `admit()` allows."""
        now = time.time()
        for slot in sorted(self._idle):
            if self._stopping or (self._admit is not None and not self._admit()):
                break
            self._idle_s += now - self._idle.pop(slot)
            self._launch(slot)

    def _launch(self, slot: int) -> None:
        if self._stopping:
            return
        if self._admit is not None and not self._admit():
            self._idle[slot] = time.time()  # waits for wake()
            return
        episode_id = next(self._ids)
        request = self._make_request(episode_id)
        self.started += 1
        self._running[episode_id] = (time.time(), request)
        task = asyncio.create_task(self._run(slot, episode_id, request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def _run(self, slot: int, episode_id: int, request: Any) -> None:
        started = time.time()
        result, error = None, None
        try:
            result = await self._run_episode(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an episode failing must never stop the run
            error = f"{type(e).__name__}: {e}"
        finished = time.time()
        self._running.pop(episode_id, None)
        duration_s = _duration_seconds(result, finished - started)
        self._duration_s += duration_s
        self._durations[episode_id] = finished - started
        self._queue.put_nowait(
            Finished(episode_id, slot, request, result, error, started, finished, duration_s)
        )
        self._launch(slot)

    # -- consumer side -----------------------------------------------------------------------
    def drain(self) -> list[Finished]:
        """The finished episodes nobody has taken yet (at shutdown: so they get logged)."""
        out = []
        while not self._queue.empty():
            out.append(self._queue.get_nowait())
        return out

    async def get_batch(self, batch_size: int, timeout_s: float | None = None) -> list[Finished]:
        """The next `batch_size` finished episodes in completion order (fewer on timeout)."""
        out: list[Finished] = []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(out) < batch_size:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                out.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return out

    def stats(self) -> SlotStats:
        now = time.time()
        wall = 0.0 if self._t0 is None else now - self._t0
        return SlotStats(
            admission_idle_s=self._idle_s + sum(now - t for t in self._idle.values()),
            num_slots=self.num_slots,
            wall_s=wall,
            duration_s=self._duration_s,
            episodes=len(self._durations),
            # The synchronous loop would start episodes in id order, K at a time.
            sync_wall_s=sync_wall_time([d for _, d in sorted(self._durations.items())],
                                       self.num_slots) if self._durations else 0.0,
        )


def _kind(request: Any) -> Any:
    return request.get("kind") if isinstance(request, dict) else None


def _duration_seconds(result: Any, default: float) -> float:
    """The result's `duration_s` (a dict key or an attribute), else `default`."""
    if result is None:
        return default
    if isinstance(result, dict):
        value = result.get("duration_s")
    else:
        value = getattr(result, "duration_s", None)
    return default if value is None else float(value)
