"""Best-of-N: identical candidates of one evaluation share a run (at most `reuse` times)."""

import asyncio
from types import SimpleNamespace

from rl4mle_jax import best_of_n as bon


def _cands(codes, kind="solve"):
    return [bon.Candidate(kind, code, None if code else "empty_code") for code in codes]


def test_shared_runs_follow_the_loops_reuse_rule():
    cands = _cands(["a", "a", "a", "a", "b", None, "b"])
    to_run, copies = bon.SharedRuns(reuse=2).assign(cands)
    # a runs, serves two copies, the third copy runs afresh; b runs and serves one; None: none
    assert to_run == [cands[0], cands[3], cands[4]]
    assert copies == [(cands[1], cands[0]), (cands[2], cands[0]), (cands[6], cands[4])]
    to_run, copies = bon.SharedRuns(reuse=0).assign(cands)
    assert to_run == [c for c in cands if c.code] and copies == []


def test_identical_candidates_take_the_records_of_the_one_that_ran(monkeypatch):
    calls = []

    async def fake_run(code, task, sandbox, split, timeout_s):
        calls.append((code, split))
        score = {"a": 0.7, "b": 0.9}[code] + (0.01 if split == "test" else 0.0)
        record = {"status": "valid", "score": score}
        return SimpleNamespace(reward=SimpleNamespace(to_dict=lambda: dict(record)),
                               duration_s=len(calls))

    monkeypatch.setattr(bon, "arun_and_grade", fake_run)
    shared = bon.SharedRuns(reuse=4)
    solve = _cands(["a", "a", "b", None])
    asyncio.run(bon._run_candidates(solve, None, None, 10.0, 2, shared))
    improve = _cands(["b", "a"], "improve")  # children equal to earlier programs: no run either
    asyncio.run(bon._run_candidates(improve, None, None, 10.0, 2, shared))
    assert sorted(calls) == [("a", "reward"), ("a", "test"), ("b", "reward"), ("b", "test")]
    assert [c.reused_run for c in solve + improve] == [False, True, False, False, True, True]
    for c in solve[1:2] + improve:
        src = {"a": solve[0], "b": solve[2]}[c.code]
        assert c.reward_split == src.reward_split and c.test_split == src.test_split
        assert c.reward_split is not src.reward_split  # a copy, not the same dict
        assert c.duration_s == src.duration_s
    assert solve[3].reward_split is None and solve[3].test_split is None
    # reuse 0: every candidate runs
    calls.clear()
    asyncio.run(bon._run_candidates(_cands(["a", "a"]), None, None, 10.0, 2, bon.SharedRuns(0)))
    assert len(calls) == 4


def test_candidate_replicates_only_where_the_score_counts():
    """`Candidate.boot`: the grader's replicates of a valid split's score (the pick carries the
    test split's, for the pick change's standard error), none for a failed or missing split."""
    boot = [0.8, 0.9]
    valid = {"status": "valid", "score": 0.85, "grade": {"score_boot": boot}}
    c = bon.Candidate("solve", "x", None, reward_split=valid,
                            test_split={**valid, "status": "failure"})
    assert c.boot("reward") == boot and c.boot("test") is None
    assert bon.Candidate("solve", None, "no_code_block").boot("test") is None
    old = bon.Candidate("solve", "x", None, test_split={"status": "valid", "score": 0.8,
                                                              "grade": {"score": 0.8}})
    assert old.boot("test") is None  # a record from before the replicates
