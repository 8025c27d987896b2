"""Best-of-N: identical candidates of one evaluation share a run (at most `reuse` times)."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

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


# --- the pick ---------------------------------------------------------------------------------
def _rec(score, boot=None, status="valid"):
    return {"status": status, "score": score, "grade": {"score_boot": boot}}


def _cand(code, reward, boot, test=0.5, kind="solve"):
    return {"kind": kind, "code": code, "failure": None, "reward_split": _rec(reward, boot),
            "test_split": _rec(test, [test] * 4)}


def _pool(direction="higher"):
    """Four programs on shared resamples: A best, B 1.5 paired s.e. below, C ~4 below, D
    invalid; A twice (its better run stands for it)."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, 64)
    sign = 1 if direction == "higher" else -1

    def boot(mu, own):
        return list(mu + sign * (noise + own))

    own = {k: rng.normal(0, 0.01, 64) for k in "ABC"}
    se = {k: float(np.std(own["A"] - own[k], ddof=1)) for k in "BC"}
    a, b, c = 0.80, 0.80 - sign * 1.5 * se["B"], 0.80 - sign * 4.0 * se["C"]
    return [_cand("A", a - sign * 0.01, boot(a, own["A"]), test=0.70),
            _cand("A", a, boot(a, own["A"]), test=0.70),
            _cand("B", b, boot(b, own["B"]), test=0.75),
            _cand("C", c, boot(c, own["C"]), test=0.90),
            {"kind": "improve", "code": "D", "failure": None,
             "reward_split": _rec(None, None, "failure"), "test_split": None},
            {"kind": "solve", "code": None, "failure": "no_code_block", "reward_split": None,
             "test_split": None}]


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_finalists_are_the_programs_within_k_paired_standard_errors_of_the_best(direction):
    cands = _pool(direction)
    fin = bon.finalists(cands, direction, k_se=2.0)
    assert [c["code"] for c in fin] == ["A", "B"] and fin[0] is cands[1]  # A's better run
    assert [c["code"] for c in bon.finalists(cands, direction, k_se=1.0)] == ["A"]
    assert [c["code"] for c in bon.finalists(cands, direction, k_se=5.0)] == ["A", "B", "C"]
    assert [c["code"] for c in bon.finalists(cands, direction, 5.0, max_finalists=2)] == \
        ["A", "B"]
    # without replicates only exact ties join the best
    bare = [{**c, "reward_split": {**c["reward_split"], "grade": {}}}
            if c["reward_split"] else c for c in cands]
    assert [c["code"] for c in bon.finalists(bare, direction, 100.0)] == ["A"]
    assert bon.finalists(cands[4:], direction) == []
    assert bon.pick_candidate(cands[4:], direction, "cv", {}, ["select1"]) is None


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_programs_with_the_same_reward_split_outcome_take_one_finalists_place(direction):
    """A2 is A with a comment: the same predictions, so the same score and replicates. It takes
    no place of its own (B gets it), unless asked; a program with the same score but other
    replicates is a different model and keeps its place."""
    cands = _pool(direction)
    twin = {**cands[1], "code": "A2", "kind": "improve"}
    pool = cands[:2] + [twin] + cands[2:]
    assert [c["code"] for c in bon.finalists(pool, direction, 5.0, 2)] == ["A", "B"]
    assert [c["code"] for c in bon.finalists(pool, direction, 5.0)] == ["A", "B", "C"]
    assert [c["code"] for c in bon.finalists(pool, direction, 5.0, 2,
                                             distinct_outcomes=False)] == ["A", "A2"]
    boot = cands[1]["reward_split"]["grade"]["score_boot"]
    other = {**twin, "reward_split": _rec(cands[1]["reward_split"]["score"], boot[::-1])}
    assert [c["code"] for c in bon.finalists(cands[:2] + [other] + cands[2:], direction, 5.0,
                                             2)] == ["A", "A2"]
    # without replicates a same-score program is not known to be the same model
    bare = [{**c, "reward_split": {**c["reward_split"], "grade": {}}} for c in pool[:3]]
    assert [c["code"] for c in bon.finalists(bare, direction, 5.0)] == ["A", "A2"]
    sel = {"A": {"select1": _rec(0.70)}, "B": {"select1": _rec(0.90 if direction == "higher"
                                                                else 0.50)}}
    assert bon.pick_candidate(pool, direction, "folds", sel, ["select1"], 5.0, 2)["code"] == "B"


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_pick_rules_rank_the_finalists_by_their_selection_split_scores(direction):
    cands = _pool(direction)
    s = 1 if direction == "higher" else -1
    folds = ["select1", "select2"]
    a, b = cands[1]["reward_split"]["score"], cands[2]["reward_split"]["score"]
    sel = {"A": {"select1": _rec(0.70), "select2": _rec(0.72)},
           "B": {"select1": _rec(0.70 + s * 0.05), "select2": _rec(0.72 + s * 0.01)}}
    assert bon.pick_candidate(cands, direction, "max", sel, folds)["code"] == "A"
    # cv: mean of reward + folds (NumPy reference), folds: the folds alone
    cv = {k: np.mean([r, *(v["score"] for v in sel[k].values())]) * s
          for k, r in (("A", a), ("B", b))}
    want = max(cv, key=cv.get)
    assert bon.pick_candidate(cands, direction, "cv", sel, folds)["code"] == want
    assert bon.pick_candidate(cands, direction, "folds", sel, folds)["code"] == "B"
    # cv_median: the median of reward + folds (NumPy reference); one lucky fold carries B under
    # cv's mean but not under the median
    lucky = {"A": {"select1": _rec(a - s * 0.01), "select2": _rec(a)},
             "B": {"select1": _rec(b + s * 0.17), "select2": _rec(b - s * 0.08)}}
    for rule, centre in (("cv", np.mean), ("cv_median", np.median)):
        key = {k: centre([r, *(v["score"] for v in lucky[k].values())]) * s
               for k, r in (("A", a), ("B", b))}
        assert bon.pick_candidate(cands, direction, rule, lucky, folds)["code"] == max(
            key, key=key.get)
    assert bon.pick_candidate(cands, direction, "cv", lucky, folds)["code"] == "B"
    assert bon.pick_candidate(cands, direction, "cv_median", lucky, folds)["code"] == "A"
    # a finalist that fails on a fold ranks after those valid on every fold
    sel["B"]["select2"] = _rec(None, None, "failure")
    assert bon.pick_candidate(cands, direction, "folds", sel, folds)["code"] == "A"
    # no selection runs: the reward split's maximum
    assert bon.pick_candidate(cands, direction, "folds", {}, folds)["code"] == "A"
    with pytest.raises(ValueError, match="pick rule"):
        bon.pick_candidate(cands, direction, "mode")


def test_a_pick_made_with_other_finalists_is_made_again():
    """`needs_repick`: another rule, no `pick_max`, or finalists other than the run's (a pick
    recorded before the finalist rule was: 2 s.e., 6, twins each in)."""
    ev = {"pick": {"rule": "cv", "finalist_rule": {"k_se": 3.0, "max": 10,
                                                   "distinct_outcomes": True}},
          "pick_max": {}}
    assert not bon.needs_repick(ev, "cv", 3.0, 10)
    assert bon.needs_repick(ev, "folds", 3.0, 10)
    assert bon.needs_repick(ev, "cv", 2.0, 10) and bon.needs_repick(ev, "cv", 3.0, 6)
    assert bon.needs_repick({"pick": ev["pick"]}, "cv", 3.0, 10)
    old = {"pick": {"rule": "cv"}, "pick_max": {}}
    assert bon.needs_repick(old, "cv", 2.0, 6) and bon.needs_repick(old, "cv")
    assert not bon.needs_repick({"pick": {"rule": "max"}, "pick_max": {}}, "max", 1.0, 1)
    assert bon.needs_repick({}, "max")


def test_selection_runs_of_another_carve_are_not_reused():
    """An evaluation whose selection runs were made on another carve of the selection splits
    (`tasks.SELECT_CARVE`) is re-picked on fresh runs: its records are dropped, not read."""
    from rl4mle_jax.env.tasks import SELECT_CARVE

    k = bon.code_key("A")
    old = {"selection": {"runs": {k: {"select1": _rec(0.9)}}}}  # carve 1: no "carve" field
    assert bon.runs_of(old, "A") == {}
    assert bon.selection_runs(old) == {} and old["selection"]["carve"] == SELECT_CARVE
    old["selection"]["runs"][k] = {"select1": _rec(0.8)}
    assert bon.runs_of(old, "A") == {"select1": _rec(0.8)}
    assert bon.selection_runs(old) is old["selection"]["runs"]  # same carve: kept
    assert bon.selection_runs(fresh := {}) == {} and fresh["selection"]["carve"] == SELECT_CARVE


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_beats_on_folds_needs_k_paired_standard_errors(direction):
    """NumPy reference: the mean oriented gap over the folds against k times the root of the
    summed paired variances over the fold count."""
    rng = np.random.default_rng(0)
    s = 1 if direction == "higher" else -1
    folds = ["select1", "select2"]
    base = {sp: rng.normal(0.8, 0.01, 50) for sp in folds}
    inc = {sp: _rec(0.8, list(base[sp])) for sp in folds}

    def challenger(shift):
        return {sp: _rec(0.8 + s * shift, list(base[sp] + s * shift + rng.normal(0, .005, 50)))
                for sp in folds}

    for shift in (0.0, 0.003, 0.02):
        ch = challenger(shift)
        gap = np.mean([s * (ch[sp]["score"] - 0.8) for sp in folds])
        se = np.sqrt(sum(np.var(np.asarray(ch[sp]["grade"]["score_boot"]) - base[sp], ddof=1)
                         for sp in folds)) / 2
        for k in (0.0, 1.0, 2.0):
            assert bon.beats_on_folds(ch, inc, folds, direction, k) == (gap > k * se)
    assert bon.beats_on_folds(challenger(0.02), inc, folds, direction)  # ~0.0035 per s.e.
    assert not bon.beats_on_folds(challenger(0.003), inc, folds, direction)
    # validity first: a challenger failing a fold never wins; an incumbent failing one loses
    bad = {**challenger(0.02), "select2": _rec(None, None, "failure")}
    assert not bon.beats_on_folds(bad, inc, folds, direction)
    assert bon.beats_on_folds(inc, bad, folds, direction)
    assert not bon.beats_on_folds(inc, inc, [], direction)
    # without replicates any margin wins
    bare = {sp: _rec(0.8) for sp in folds}
    assert bon.beats_on_folds({sp: _rec(0.8 + s * 1e-6) for sp in folds}, bare, folds, direction)
    assert not bon.beats_on_folds(bare, bare, folds, direction)


def test_candidates_that_do_not_parse_keep_their_code_to_read_but_never_to_run(monkeypatch):
    """`_sample_codes`: a block that does not compile is kept in `failed_code` with the parser's
    message (the evaluation's failures can be read afterwards); `code` stays None, so nothing
    runs it."""
    responses = ["plan\n```python\nprint(1)\n```", "plan\n```python\nx = f(1\ny = 2\n```",
                 "plan\n```python\n\n```", "no block at all"]
    tok = SimpleNamespace(encode=lambda s: [1, 2, 3],
                          decode=lambda ids, skip_special_tokens: responses[ids[0]])
    sampler = SimpleNamespace(generate=lambda params, ids, rng, **kw: SimpleNamespace(
        tokens=np.arange(len(ids))[:, None], lengths=np.ones(len(ids), np.int32)))
    comps = SimpleNamespace(tokenizer=tok, sampler=sampler)
    cands = bon._sample_codes(comps, None, ["p"] * 4, None, "improve", 0.7, 8)
    assert [c.failure for c in cands] == [None, "syntax_error", "empty_code", "no_code_block"]
    assert [c.code for c in cands] == ["print(1)\n", None, None, None]
    assert cands[0].failed_code is None and cands[0].failure_message is None
    assert cands[1].failed_code == "x = f(1\ny = 2\n"
    assert cands[1].failure_message.startswith("SyntaxError at line 1: '(' was never closed")
    assert cands[2].failed_code == "\n" and cands[3].failed_code is None
    assert "no fenced" in cands[3].failure_message
    to_run, _ = bon.SharedRuns(reuse=0).assign(cands)
    assert to_run == cands[:1]
