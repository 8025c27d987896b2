"""Reuse of an identical program's run: counted reuses, arrival time kept, shared in flight."""

import asyncio
import time

import pytest

from rl4mle_jax.env.prompts import Prompt
from rl4mle_jax.rollout.episode import EpisodeConfig, EpisodeRunner
from rl4mle_jax.rollout.run_cache import RunCache
from rl4mle_jax.rollout.service import Generation


def _counting_run(calls, result="r", sleep_s=0.0, fail=False):
    async def run():
        calls.append(time.monotonic())
        await asyncio.sleep(sleep_s)
        if fail:
            raise RuntimeError("sandbox down")
        return f"{result}{len(calls)}"
    return run


def test_reuses_up_to_max_then_runs_afresh():
    async def main():
        cache, calls = RunCache(max_reuse=2), []
        k = RunCache.key("print(1)", "reward", 60.0)
        got = [await cache.get(k, _counting_run(calls)) for _ in range(7)]
        return cache, calls, got
    cache, calls, got = asyncio.run(main())
    # run, reuse, reuse, run (new entry), reuse, reuse, run
    assert [r for _, r in got] == [False, True, True, False, True, True, False]
    assert [v for v, _ in got] == ["r1", "r1", "r1", "r2", "r2", "r2", "r3"]
    assert (cache.runs, cache.reuses, len(calls)) == (3, 4, 3)


def test_keys_differ_by_code_split_and_limit():
    keys = {RunCache.key("a", "reward", 60.0), RunCache.key("a ", "reward", 60.0),
            RunCache.key("a", "test", 60.0), RunCache.key("a", "reward", 30.0)}
    assert len(keys) == 4


def test_off_always_runs():
    async def main():
        cache, calls = RunCache(max_reuse=0), []
        return [await cache.get("k", _counting_run(calls)) for _ in range(3)], cache
    got, cache = asyncio.run(main())
    assert [r for _, r in got] == [False] * 3 and len(cache) == 0


def test_a_reuse_waits_out_the_originals_time():
    """Arrival order is kept: a reused run comes back no sooner than the original took."""
    async def main():
        cache, calls = RunCache(max_reuse=4), []
        t0 = time.monotonic()
        await cache.get("k", _counting_run(calls, sleep_s=0.3))
        t1 = time.monotonic()
        _, reused = await cache.get("k", _counting_run(calls))
        return t1 - t0, time.monotonic() - t1, reused, len(calls)
    first, second, reused, n = asyncio.run(main())
    assert reused and n == 1
    assert second >= 0.3 * 0.95 and second < first + 0.2


def test_identical_programs_in_flight_share_one_run():
    async def main():
        cache, calls = RunCache(max_reuse=8), []
        t0 = time.monotonic()
        first = asyncio.create_task(cache.get("k", _counting_run(calls, sleep_s=0.3)))
        await asyncio.sleep(0.1)
        second = await cache.get("k", _counting_run(calls))
        return await first, second, time.monotonic() - t0, len(calls)
    first, second, elapsed, n = asyncio.run(main())
    assert first == ("r1", False) and second == ("r1", True) and n == 1
    assert elapsed >= 0.39  # the second started 0.1 s late and waited the original's 0.3 s


def test_a_failed_original_is_not_reused():
    async def main():
        cache, calls = RunCache(max_reuse=8), []
        first = asyncio.create_task(cache.get("k", _counting_run(calls, sleep_s=0.1, fail=True)))
        await asyncio.sleep(0.02)
        second = await cache.get("k", _counting_run(calls))  # waits, sees the failure, runs
        with pytest.raises(RuntimeError, match="sandbox down"):
            await first
        third = await cache.get("k", _counting_run(calls))
        return second, third, len(calls)
    second, third, n = asyncio.run(main())
    assert second == ("r2", False) and third == ("r2", True) and n == 2


def test_entries_are_bounded():
    async def main():
        cache, calls = RunCache(max_reuse=1, max_entries=3), []
        for i in range(10):
            await cache.get(str(i), _counting_run(calls))
        _, reused_old = await cache.get("0", _counting_run(calls))
        _, reused_new = await cache.get("9", _counting_run(calls))
        return len(cache), reused_old, reused_new
    assert asyncio.run(main()) == (3, False, True)


class _Tok:
    is_chat = False

    def encode(self, text):
        return [ord(c) % 256 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class _Policy:
    def __init__(self, responses):
        self.responses = list(responses)

    async def generate(self, prompt_ids):
        ids = [ord(c) for c in self.responses.pop(0)]
        return Generation(prompt_ids, ids, [0.0] * len(ids), True, 0)


def test_episodes_of_the_same_code_share_the_run(monkeypatch):
    code_a, code_b = "x = 1\n", "x = 2\n"
    responses = [f"Plan {i}.\n```python\n{c}```" for i, c in enumerate([code_a, code_a, code_b])]
    runner = EpisodeRunner(task=None, tokenizer=_Tok(), policy=_Policy(responses), sandbox=None,
                           instrumenter=None, buffer=[], context=None,
                           cfg=EpisodeConfig(reuse_runs=4), reward_cfg=None, prompt_cfg=None)
    monkeypatch.setattr(runner, "prompt_for", lambda request: Prompt("solve", [], 1))
    ran = []

    class _Rec:
        def __init__(self, code):
            self.reward, self.code = 0.5, code

        def to_dict(self):
            return {"reward": self.reward, "code": self.code}

    async def fake_run(action):
        ran.append(action.code)
        return _Rec(action.code), 1.5, {"instrument_s": 0.0, "sandbox_wall_s": 1.6,
                                        "grade_s": 0.0}
    monkeypatch.setattr(runner, "_run", fake_run)

    async def main():
        return [await runner(runner.make_request(i)) for i in range(3)]
    exps = asyncio.run(main())
    assert ran == [code_a, code_b]
    assert [e.reused_run for e in exps] == [False, True, False]
    assert exps[1].duration_s == 1.5 and exps[1].record == exps[0].record
    assert exps[1].plan == "Plan 1." and "reused_run" in exps[1].log_record()


def test_an_improve_episode_records_the_parent_lines_its_prompt_left_out(monkeypatch):
    runner = EpisodeRunner(task=None, tokenizer=_Tok(), policy=_Policy(["P.\n```\nx\n```"] * 3),
                           sandbox=None, instrumenter=None, buffer=[], context=None,
                           cfg=EpisodeConfig(), reward_cfg=None, prompt_cfg=None)
    omitted = {"whole": 0, "cut": 7}
    monkeypatch.setattr(runner, "prompt_for", lambda request: Prompt(
        "p", [], 1, {"code_lines_omitted": omitted[request["parent"]["code"]]}
        if request["parent"] else {}))

    class _Rec:
        reward = 0.5

        def to_dict(self):
            return {"reward": 0.5}

    async def fake_run(action):
        return _Rec(), 1.0, {}
    monkeypatch.setattr(runner, "_run", fake_run)
    requests = [{"episode_id": i, "kind": k, "parent": p} for i, (k, p) in enumerate(
        [("solve", None), ("improve", {"code": "whole", "episode_id": 0}),
         ("improve", {"code": "cut", "episode_id": 0})])]

    async def main():
        return [await runner(r) for r in requests]
    exps = asyncio.run(main())
    assert [e.parent_lines_omitted for e in exps] == [None, 0, 7]
    assert exps[2].log_record()["parent_lines_omitted"] == 7

