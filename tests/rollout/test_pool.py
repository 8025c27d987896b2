"""The rollout pool delivers episodes in completion order and measures slot utilisation."""

import asyncio

import pytest

from rl4mle_jax.rollout.pool import RolloutPool, sync_wall_time


def test_sync_wall_time_waits_for_slowest_of_each_group():
    assert sync_wall_time([1, 5, 1, 1], num_slots=2) == 5 + 1
    assert sync_wall_time([1, 5, 1], num_slots=4) == 5


def test_completion_order_and_utilisation():
    # Episode 0 is slow, all others fast: with 2 slots, the fast ones must overtake it.
    def duration(episode_id):
        return 0.6 if episode_id == 0 else 0.05

    async def run_episode(request):
        await asyncio.sleep(request["duration"])
        return {"duration": request["duration"], "duration_s": request["duration"]}

    async def main():
        pool = RolloutPool(run_episode, lambda i: {"id": i, "duration": duration(i)},
                           num_slots=2)
        pool.start()
        batch = await pool.get_batch(14, timeout_s=10)
        await pool.stop()
        return batch, pool.stats()

    batch, stats = asyncio.run(main())
    finish_times = [f.finished_at for f in batch]
    assert finish_times == sorted(finish_times)
    # Slot 1 keeps returning fast episodes while slot 0 runs the slow one.
    ids = [f.episode_id for f in batch]
    assert ids[:8] == list(range(1, 9))
    assert 0 in ids[9:]
    assert stats.episodes >= 14
    assert 0.5 < stats.utilisation <= 1.0
    assert stats.sync_utilisation < stats.utilisation


def test_episode_errors_are_recorded_and_the_pool_goes_on():
    async def run_episode(request):
        await asyncio.sleep(0.01)
        if request % 2:
            raise RuntimeError(f"sandbox crashed on {request}")
        return {"ok": request}

    async def main():
        pool = RolloutPool(run_episode, lambda i: i, num_slots=1)
        pool.start()
        batch = await pool.get_batch(4, timeout_s=5)
        await pool.stop()
        return batch

    batch = asyncio.run(main())
    assert [f.error for f in batch] == [None, "RuntimeError: sandbox crashed on 1", None,
                                        "RuntimeError: sandbox crashed on 3"]


def test_admission_control_holds_slots_until_woken():
    """With a bound of 3 started-but-unconsumed episodes, 4 slots start only 3; each consumed
    episode (wake) lets exactly one more start; nothing is discarded and idle time counts."""
    consumed = {"n": 0}

    async def run_episode(request):
        await asyncio.sleep(0.02)
        return {"duration_s": 0.02}

    async def main():
        pool = RolloutPool(run_episode, lambda i: {"id": i}, num_slots=4,
                           admit=lambda: pool.started - consumed["n"] < 3)
        pool.start()
        assert pool.started == 3 and pool.in_flight == 3
        first = await pool.get_batch(3, timeout_s=5)
        assert pool.started == 3  # finished but not consumed: still counted against the bound
        assert await pool.get_batch(1, timeout_s=0.2) == []
        consumed["n"] += 2
        pool.wake()
        assert pool.started == 5
        more = await pool.get_batch(2, timeout_s=5)
        cancelled = await pool.stop()
        return first, more, cancelled, pool.stats()

    first, more, cancelled, stats = asyncio.run(main())
    assert [f.episode_id for f in first + more] == [0, 1, 2, 3, 4]
    assert cancelled == []  # everything started finished
    assert stats.admission_idle_s > 0.2 and 0 < stats.admission_idle_frac < 1


def test_stop_reports_the_episodes_still_running():
    async def run_episode(request):
        await asyncio.sleep(10 if request["id"] == 0 else 0.01)
        return {}

    async def main():
        pool = RolloutPool(run_episode, lambda i: {"id": i, "kind": "solve"}, num_slots=2)
        pool.start()
        await pool.get_batch(3, timeout_s=5)
        return await pool.stop()

    slow, fast = asyncio.run(main())  # the slow one, and the fast slot's next episode
    assert slow["episode_id"] == 0 and slow["kind"] == "solve" and 0 < slow["elapsed_s"] < 10
    assert fast["episode_id"] == 4 and fast["elapsed_s"] < slow["elapsed_s"]


def test_every_started_episode_is_taken_drained_or_cancelled():
    """At shutdown nothing started goes unaccounted: finished episodes no batch took come back
    from drain(), the ones still running from stop()."""
    async def run_episode(request):
        await asyncio.sleep(5 if request["id"] == 1 else 0.01)
        return {}

    async def main():
        pool = RolloutPool(run_episode, lambda i: {"id": i}, num_slots=2)
        pool.start()
        taken = await pool.get_batch(2, timeout_s=5)
        await asyncio.sleep(0.1)  # more finish meanwhile, nobody takes them
        cancelled = await pool.stop()
        return taken, pool.drain(), cancelled, pool.started

    taken, drained, cancelled, started = asyncio.run(main())
    ids = [f.episode_id for f in taken + drained] + [c["episode_id"] for c in cancelled]
    assert drained and sorted(ids) == list(range(started))
    assert 1 in [c["episode_id"] for c in cancelled]  # the slow one (and the fast slot's next)


def test_an_episode_that_ends_while_cancelled_is_finished_not_cancelled():
    """An episode can swallow the cancellation and return (asyncio.wait_for does when its inner
    future completes at that moment): stop() must then not report it, drain() has it. A run
    crashed on this at shutdown (the arrival model saw the episode end twice)."""
    async def run_episode(request):
        try:
            await asyncio.sleep(10 if request["id"] == 0 else 0.01)
        except asyncio.CancelledError:
            if request["id"] == 0:
                return {"ended": "while cancelled"}
            raise
        return {}

    async def main():
        pool = RolloutPool(run_episode, lambda i: {"id": i}, num_slots=2)
        pool.start()
        taken = await pool.get_batch(3, timeout_s=5)
        cancelled = await pool.stop()
        return taken, pool.drain(), cancelled, pool.started

    taken, drained, cancelled, started = asyncio.run(main())
    assert 0 in [f.episode_id for f in drained]
    assert 0 not in [c["episode_id"] for c in cancelled]
    ids = [f.episode_id for f in taken + drained] + [c["episode_id"] for c in cancelled]
    assert sorted(ids) == list(range(started)), "an episode reported twice or lost"


def test_bad_slot_count():
    with pytest.raises(ValueError, match="num_slots"):
        RolloutPool(lambda r: r, lambda i: i, num_slots=0)


def test_real_sandbox_programs_arrive_in_completion_order(tmp_path):
    from rl4mle_jax.env.sandbox import Sandbox

    (tmp_path / "input").mkdir()
    sandbox = Sandbox("bwrap", timeout_s=20, work_root=tmp_path / "runs")
    # Episode 0 runs a slow program; the others a fast one. Two slots.
    slow, fast = 6.0, 0.05

    async def run_episode(request):
        code = f"import time; time.sleep({request['sleep']}); print('done')"
        res = await sandbox.arun(code, tmp_path / "input")
        res.cleanup()
        assert res.status == "ok", res.stderr
        return {"sleep": request["sleep"], "duration_s": res.duration_s}

    async def main():
        pool = RolloutPool(run_episode,
                           lambda i: {"sleep": slow if i == 0 else fast}, num_slots=2)
        pool.start()
        batch = await pool.get_batch(3, timeout_s=60)
        await pool.stop()
        return batch

    batch = asyncio.run(main())
    assert [f.result["sleep"] for f in batch] == [fast] * 3
    assert all(f.episode_id != 0 for f in batch)
    assert all(f.duration_s >= fast for f in batch)
