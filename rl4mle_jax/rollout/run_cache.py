"""Reusing the run of a program the loop has already run, byte for byte (`run.reuse_runs`).

A policy near its warm start writes the same program again and again: on the embedded default
two of every three programs in a 300 s run were byte-identical to an earlier one, and each run
costs 2-3 s of a CPU core that sampling and the learner also need. With `run.reuse_runs = N > 0`
an episode whose code equals (sha256) an earlier episode's takes that run's instrumented program,
reward record and Δt instead of running again, at most N times per run: the (N+1)-th identical
program runs afresh and becomes the new entry, so a program whose result varies from run to run
(no seed, timing-dependent) is drawn again at a fixed rate, not frozen at its first draw.

What stays faithful: **arrival order**. A reused episode does not come back early: it waits out
the original's wall-clock time (instrumentation + sandbox + grading, from its own start), so
fast programs still arrive first by exactly as much as when they run, and the duration-aware
weights see the same Δt. What changes: the CPU time (the wait costs none) and the frozen copy's
instrumentation call (the original's verified program is reused). Nothing the program wrote is
reused: only the host's own record of it (status, milestones, score, Δt).

Identical programs in flight at once share one run: the later ones wait for the first's result.
The key is the agent's code plus the split and time limit, per task (one cache per runner).
Off (0) in the paper's configuration: every program runs.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any


@dataclasses.dataclass
class _Entry:
    future: asyncio.Future
    elapsed_s: float = 0.0  # the original's wall-clock time, set when it finishes
    uses: int = 0  # reuses so far


class RunCache:
    """Per-task cache of finished runs, keyed by the program's bytes, bounded in entries."""

    def __init__(self, max_reuse: int, max_entries: int = 4096):
        if max_reuse < 0 or max_entries < 1:
            raise ValueError(f"max_reuse must be >= 0 and max_entries >= 1, got "
                             f"{max_reuse}, {max_entries}")
        self.max_reuse, self.max_entries = max_reuse, max_entries
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self.runs = self.reuses = 0

    @staticmethod
    def key(code: str, *parts: Any) -> str:
        h = hashlib.sha256(code.encode("utf-8", "surrogatepass"))
        for p in parts:
            h.update(b"\0" + repr(p).encode())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str, run: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        """(result, reused): the cached result of `key` (waiting out the original's time), or
        `run()`'s when there is none, its reuses are spent, or the original failed."""
        entry = self._entries.get(key) if self.max_reuse else None
        if entry is not None and entry.uses < self.max_reuse:
            entry.uses += 1
            self._entries.move_to_end(key)
            t0 = time.monotonic()
            try:
                result = await asyncio.shield(entry.future)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - the original failed
                if not entry.future.done():  # we were cancelled ourselves
                    raise
            else:
                await asyncio.sleep(max(0.0, entry.elapsed_s - (time.monotonic() - t0)))
                self.reuses += 1
                return result, True
        return await self._run(key, run), False

    async def _run(self, key: str, run: Callable[[], Awaitable[Any]]) -> Any:
        self.runs += 1
        if not self.max_reuse:
            return await run()
        entry = _Entry(asyncio.get_running_loop().create_future())
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        t0 = time.monotonic()
        try:
            result = await run()
        except BaseException as e:
            if self._entries.get(key) is entry:
                del self._entries[key]
            entry.future.set_exception(e if isinstance(e, Exception)
                                       else RuntimeError("the original run was cancelled"))
            entry.future.exception()  # retrieved: waiters fall back to running themselves
            raise
        entry.elapsed_s = time.monotonic() - t0
        entry.future.set_result(result)
        return result
