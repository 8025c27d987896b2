"""Reward values per outcome (the paper's scheme), normalisation, error parsing, the record."""

import json
from pathlib import Path

import pytest

from rl4mle_jax.env.actions import extract_action
from rl4mle_jax.env.grading import GradeReport
from rl4mle_jax.env.instrument import instrument_static, new_nonce
from rl4mle_jax.env.instrument_lm import verify_lm_instrumentation
from rl4mle_jax.env.reward import (
    RewardConfig,
    RewardRecord,
    compute_reward,
    normalise_score,
    parse_error,
    reward_replicates,
)
from rl4mle_jax.env.sandbox import ExecResult

CODE = """import pandas as pd
from sklearn.linear_model import LogisticRegression
train = pd.read_csv("input/train.csv")
model = LogisticRegression()
model.fit(train[["a"]], train["y"])
pred = model.predict_proba(train[["a"]])[:, 1]
pd.DataFrame({"id": train["id"], "y": pred}).to_csv("submission/submission.csv")
"""
ALL = ("libraries_imported", "data_loaded", "model_defined", "model_trained",
       "predictions_made", "submission_written")


def _exec(status="ok", stdout="", stderr="", submission=True, truncated=False, exit_code=0):
    return ExecResult(status=status, exit_code=exit_code, duration_s=1.5, stdout=stdout,
                      stderr=stderr, submission_path=Path("/nowhere/submission.csv"),
                      submission_exists=submission, workdir=Path("/nowhere"), backend="test",
                      stdout_truncated=truncated)


def _grade(valid=True, score=0.8, direction="higher", refs=None, reason=None):
    return GradeReport(task_id="t", split="reward", metric="auc", direction=direction,
                       valid=valid, score=score if valid else None, reason=reason,
                       message="" if valid else "expected 10 rows, got 9",
                       reference_scores=refs or {})


def _markers(nonce, milestones):
    return "".join(f"@@MS {nonce} {m}\n" for m in milestones)


def _reward(stdout_ms=ALL, code=CODE, **kw):
    prog, nonce = instrument_static(code), new_nonce()
    ex = kw.pop("exec_result", None) or _exec(stdout=_markers(nonce, stdout_ms))
    return compute_reward(extract_action(f"plan\n```python\n{code}```"), prog, ex,
                          kw.pop("grade", _grade()), nonce, **kw)


def test_valid_submission_gets_the_score_sign_flipped_when_lower_is_better():
    assert _reward().reward == pytest.approx(0.8)
    rec = _reward(grade=_grade(score=0.3, direction="lower"))
    assert rec.status == "valid" and rec.reward == pytest.approx(-0.3) and rec.score == 0.3
    raw = _reward(grade=_grade(score=0.3, direction="lower"), cfg=RewardConfig(
        normalisation="raw"))
    assert raw.reward == pytest.approx(0.3)


def test_rescaled_against_reference_scores():
    cfg = RewardConfig(normalisation="rescaled")
    refs = {"baseline": 0.6, "strong": 0.9}
    assert _reward(grade=_grade(score=0.75, refs=refs), cfg=cfg).reward == pytest.approx(0.5)
    # lower is better: baseline 2.0, strong 1.0; 1.5 is half-way, 2.5 is worse than baseline
    lower = {"baseline": 2.0, "strong": 1.0}
    assert normalise_score(1.5, "lower", lower, cfg)[0] == pytest.approx(0.5)
    assert normalise_score(2.5, "lower", lower, cfg)[0] == pytest.approx(-0.5)
    assert normalise_score(0.7, "higher", {}, cfg) == (0.7, "flipped (no reference scores)")
    with pytest.raises(ValueError, match="direction"):
        normalise_score(1.0, "up", {}, cfg)


@pytest.mark.parametrize("norm", ["rescaled", "auto"])
def test_rescaled_unit_is_at_least_two_standard_errors_of_the_split(norm):
    """Where the references' gap is below what the split resolves, one reward unit is
    RESCALE_MIN_SE standard errors of a score there (NumPy reference); a gap above it, or no
    standard error, keeps the gap. The map stays affine and increasing in the oriented score,
    and the record, its replicates and the reward agree."""
    import numpy as np

    from rl4mle_jax.env.reward import RESCALE_MIN_SE, rescale_unit
    assert RESCALE_MIN_SE == 2.0
    cfg = RewardConfig(normalisation=norm)
    # An MAE in price units (auto rescales it): references 620 apart, a score's SE 1200.
    refs, se = {"baseline": 12271.7, "strong": 11652.0}, 1200.0
    scores = np.array([10000.0, 11652.0, 12271.7, 14530.8, 30000.0])
    want = -(scores - 12271.7) / max(abs(11652.0 - 12271.7), 2.0 * se)
    got = np.array([normalise_score(x, "lower", refs, cfg, se)[0] for x in scores])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(np.diff(got) < 0)  # lower MAE, more reward
    assert rescale_unit(refs, cfg, se) == pytest.approx(2400.0)
    # Without a standard error, or with one the gap exceeds: the gap, as before.
    for small in (None, 100.0, float("nan")):
        np.testing.assert_allclose(
            [normalise_score(x, "lower", refs, cfg, small)[0] for x in scores],
            -(scores - 12271.7) / 619.7, rtol=1e-12)
    # A strong reference worse than the baseline (a small split's noise) keeps the sign.
    auc = {"baseline": 3.8439, "strong": 3.8342}  # a score over 1 in size, so auto rescales too
    assert normalise_score(3.8639, "higher", auc, cfg, 0.02)[0] == pytest.approx(0.02 / 0.04)
    # compute_reward reads the grade report's reference_se; the replicates use it too.
    g = _grade(score=14530.8, direction="lower", refs=refs)
    g.reference_se, g.score_boot = se, [14000.0, 15000.0]
    rec = _reward(grade=g, cfg=cfg)
    assert rec.reward == pytest.approx(got[3]) and rec.normalised_score == pytest.approx(got[3])
    reps = reward_replicates([json.loads(json.dumps(rec.to_dict()))], cfg)
    np.testing.assert_allclose(reps[0], [-(14000.0 - 12271.7) / 2400.0,
                                         -(15000.0 - 12271.7) / 2400.0], rtol=1e-12)
    # reward.rescale_min_se: the multiple (0: the gap alone); checked.
    np.testing.assert_allclose(
        [normalise_score(x, "lower", refs, RewardConfig(normalisation=norm, rescale_min_se=0.0),
                         se)[0] for x in scores], -(scores - 12271.7) / 619.7, rtol=1e-12)
    assert rescale_unit(refs, RewardConfig(normalisation=norm, rescale_min_se=1.0), se) == 1200.0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="rescale_min_se"):
            RewardConfig(rescale_min_se=bad)
    # The flipped reward (the paper's) ignores it.
    assert normalise_score(0.8, "higher", refs, RewardConfig(), se) == (0.8, "flipped")
    # A valid program far below the references is paid what a failure with every milestone is,
    # no less (the unclipped value stays in the record), under either normalisation.
    from rl4mle_jax.env.reward import valid_floor
    far = _reward(grade=_grade(score=1e6, direction="lower", refs=refs), cfg=cfg)
    assert far.reward == pytest.approx(valid_floor(cfg)) and far.normalised_score < -100


def test_auto_keeps_the_paper_flip_unless_the_baseline_is_large():
    """"auto": flipped where the baseline scores within AUTO_FLIPPED_MAX_ABS of 0, rescaled
    where not, so a valid submission is never paid less than a failure for its units."""
    from rl4mle_jax.env.reward import AUTO_FLIPPED_MAX_ABS
    cfg = RewardConfig(normalisation="auto")
    assert AUTO_FLIPPED_MAX_ABS == 1.0
    auc = {"baseline": 0.86, "strong": 0.87}
    assert normalise_score(0.88, "higher", auc, cfg) == (0.88, "flipped (auto)")
    assert normalise_score(0.35, "lower", {"baseline": 0.348}, cfg) == (-0.35, "flipped (auto)")
    assert normalise_score(3.0, "lower", {}, cfg) == (-3.0, "flipped (auto, no reference scores)")
    rmse = {"baseline": 22.77, "strong": 14.30}
    value, used = normalise_score(15.0, "lower", rmse, cfg)
    assert used == "rescaled (auto)" and value == pytest.approx((22.77 - 15.0) / 8.47)
    assert value == pytest.approx(normalise_score(15.0, "lower", rmse, RewardConfig(
        normalisation="rescaled"))[0])
    # Flipped, the same valid program would be paid less than any failure.
    assert normalise_score(15.0, "lower", rmse, RewardConfig())[0] < RewardConfig().failure_reward
    rec = _reward(grade=_grade(score=15.0, direction="lower", refs=rmse), cfg=cfg)
    assert rec.status == "valid" and rec.reward == pytest.approx(value)
    assert rec.normalisation == "rescaled (auto)"
    # A valid program predicting garbage (RMSE 1e12) is paid no less than a failure with every
    # milestone under "auto" (the paper's flipped keeps the raw value); the record keeps both.
    from rl4mle_jax.env.reward import valid_floor
    huge = _reward(grade=_grade(score=1e12, direction="lower", refs=rmse), cfg=cfg)
    assert valid_floor(cfg) == pytest.approx(-10 + 0.1 * 6)
    assert huge.reward == pytest.approx(valid_floor(cfg)) and huge.normalised_score < -1e10
    flipped = _reward(grade=_grade(score=1e12, direction="lower", refs=rmse))
    assert flipped.reward == pytest.approx(-1e12)


@pytest.mark.parametrize("norm", ["raw", "flipped", "rescaled"])
def test_reward_replicates_are_the_grader_replicates_in_the_reward_scale(norm):
    """Each valid record's `grade.score_boot` through the same normalisation as its reward (so
    replicate gaps and reward gaps compare); failures and records without replicates: NaN."""
    import numpy as np
    cfg = RewardConfig(normalisation=norm)
    refs = {"baseline": 2.0, "strong": 1.0}
    recs = []
    for score, boot in ((1.5, [1.4, 1.6, float("nan")]), (1.2, [1.1, 1.3, 1.25])):
        g = _grade(score=score, direction="lower", refs=refs)
        g.score_boot = boot
        rec = _reward(grade=g, cfg=cfg).to_dict()
        recs.append(json.loads(json.dumps(rec)))  # as the experience log holds it
    failure = _reward(grade=_grade(valid=False, reason="bad_shape")).to_dict()
    old = dict(recs[1], grade={**recs[1]["grade"], "score_boot": None})
    got = reward_replicates([recs[0], failure, recs[1], old, None], cfg)
    assert got.shape == (5, 3)
    for row, rec in ((0, recs[0]), (2, recs[1])):
        want = [normalise_score(b, "lower", refs, cfg)[0] for b in rec["grade"]["score_boot"]]
        np.testing.assert_allclose(got[row], want, rtol=1e-12)
        # The reward itself is the same map of the score.
        assert rec["reward"] == pytest.approx(normalise_score(rec["score"], "lower", refs,
                                                              cfg)[0])
    assert np.isnan(got[[1, 3, 4]]).all()
    assert reward_replicates([failure, old], cfg) is None


@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("status, submission, reason", [
    ("timeout", False, "timeout"), ("error", False, "runtime_error"), ("oom", False, "oom"),
    ("ok", False, "no_submission")])
def test_failure_is_minus_ten_plus_a_tenth_per_milestone(k, status, submission, reason):
    nonce = new_nonce()
    rec = compute_reward(None, instrument_static(CODE), _exec(
        status=status, stdout=_markers(nonce, ALL[:k]), submission=submission,
        exit_code=None if status == "timeout" else 1), None, nonce)
    assert rec.status == "failure" and rec.failure_reason == reason
    assert rec.reward == pytest.approx(-10 + 0.1 * k) and rec.milestones == list(ALL[:k])


def test_invalid_submission_is_a_failure_with_the_grader_reason():
    rec = _reward(stdout_ms=ALL, grade=_grade(valid=False, reason="wrong_row_count"))
    assert rec.failure_reason == "invalid_submission:wrong_row_count"
    assert rec.reward == pytest.approx(-10 + 0.6)


def test_milestones_count_once_and_constants_come_from_the_config():
    twice = ("model_trained", "data_loaded") * 3
    rec = _reward(stdout_ms=twice, grade=_grade(valid=False, reason="no_file"))
    assert rec.milestones == ["model_trained", "data_loaded"]
    assert rec.reward == pytest.approx(-9.8)
    cfg = RewardConfig(failure_reward=-1.0, milestone_reward=0.25, milestones=ALL[:1])
    rec = _reward(stdout_ms=ALL, grade=_grade(valid=False, reason="no_file"), cfg=cfg)
    assert rec.reward == pytest.approx(-0.75) and rec.milestones == ["libraries_imported"]


def test_no_code_and_syntax_errors_are_plain_failures():
    for resp, reason in (("I would use a random forest.", "no_code_block"),
                         ("```python\ndef f(:\n```", "syntax_error")):
        action = extract_action(resp)
        rec = compute_reward(action, None, None, None, None)
        assert rec.reward == -10.0 and rec.failure_reason == reason
        assert rec.error["message"] == action.message


def test_no_model_training_is_minus_ten_statically_and_dynamically():
    copy = ("import shutil\nshutil.copy('input/sample_submission.csv', "
            "'submission/submission.csv')\n")
    rec = _reward(code=copy, stdout_ms=("libraries_imported",))
    assert rec.status == "no_model_training" and rec.reward == -10.0
    assert rec.failure_reason == "no_model_training" and rec.static_training is False
    # a fit exists but the marker after it was never printed: the fit did not run
    rec = _reward(stdout_ms=tuple(m for m in ALL if m != "model_trained"))
    assert rec.status == "no_model_training" and rec.failure_reason == \
        "model_training_not_reached"
    # ... unless the output was cut, where a missing marker proves nothing
    nonce = new_nonce()
    rec = compute_reward(None, instrument_static(CODE), _exec(
        stdout=_markers(nonce, ALL[:2]), truncated=True), _grade(), nonce)
    assert rec.status == "valid"
    # an accepted LM instrumentation without a model_trained marker: only the static check
    answer = "```python\n" + CODE.replace("import pandas as pd\n", "import pandas as pd\n"
                                          "print('@@MILESTONE libraries_imported')\n") + "```"
    prog, _ = verify_lm_instrumentation(CODE, answer)
    nonce = new_nonce()
    rec = compute_reward(None, prog, _exec(stdout=_markers(nonce, ALL[:1])), _grade(), nonce)
    assert rec.status == "valid" and rec.instrumentation["method"] == "lm"


def test_forged_markers_and_introspection_earn_nothing():
    nonce = new_nonce()
    forged = _markers(new_nonce(), ALL) + "".join(f"@@MS {m}\n" for m in ALL)
    rec = compute_reward(None, instrument_static(CODE), _exec(stdout=forged, submission=False),
                         None, nonce)
    assert rec.reward == -10.0 and rec.forged_marker_lines == 6 and not rec.nonce_verified
    sneaky = CODE + "print(open(__file__).read())\n"
    rec = compute_reward(None, instrument_static(sneaky), _exec(
        stdout=_markers(nonce, ALL), submission=False), None, nonce)
    assert rec.reward == -10.0 and not rec.markers_trusted and rec.milestones == []


def test_a_copied_nonce_on_an_unplaced_milestone_voids_all_markers():
    code = "import os\nraise SystemExit(1)\n"
    prog, nonce = instrument_static(code), new_nonce()
    assert prog.milestones == ("libraries_imported",)
    rec = compute_reward(None, prog, _exec(status="error", submission=False, stdout=_markers(
        nonce, ("libraries_imported", "model_trained"))), None, nonce)
    assert not rec.markers_trusted and rec.milestones == [] and rec.reward == -10.0


def test_record_says_when_the_lm_instrumentation_was_rejected():
    from rl4mle_jax.env.instrument_lm import Instrumenter

    bad = "```python\n" + CODE.replace("LogisticRegression()", "LogisticRegression(C=9)") + "```"
    prog = Instrumenter("lm", generate=lambda p: bad)(CODE)
    nonce = new_nonce()
    rec = compute_reward(None, prog, _exec(stdout=_markers(nonce, ALL)), _grade(), nonce)
    assert rec.instrumentation["method"] == "static_fallback"
    assert rec.instrumentation["reason"] == "ast_mismatch" and not rec.instrumentation["accepted"]
    assert rec.status == "valid" and rec.milestones == list(ALL)


def test_record_is_json_and_round_trips():
    rec = _reward(grade=_grade(score=0.3, direction="lower", refs={"baseline": 0.5}))
    d = json.loads(rec.to_json())
    assert d["grade"]["reference_scores"] == {"baseline": 0.5} and d["duration_s"] == 1.5
    assert d["milestones"] == list(ALL) and d["nonce_verified"] and d["direction"] == "lower"
    assert RewardRecord.from_dict(d) == rec


def test_parse_error_maps_to_the_agents_code():
    code = "import os\nfor i in range(2):\n    x = i\nraise ValueError('bad value')\n"
    answer = "```python\nimport os\nfor i in range(2):\n    x = i\n" \
             "print('@@MILESTONE model_trained')\nraise ValueError('bad value')\n```"
    prog, _ = verify_lm_instrumentation(code, answer)
    stderr = ('Traceback (most recent call last):\n  File "/work/main.py", line 5, in <module>\n'
              "    raise ValueError('bad value')\nValueError: bad value\n")
    err = parse_error(stderr, prog)
    assert err == {"type": "ValueError", "message": "bad value", "line": 4,
                   "source": "raise ValueError('bad value')"}
    lib = ('Traceback (most recent call last):\n  File "/w/main.py", line 3, in <module>\n'
           "    x = i\n  File \"/usr/lib/python3/site.py\", line 99, in f\n    g()\n"
           "pandas.errors.ParserError: Error tokenizing data\n")
    err = parse_error(lib, instrument_static(code))
    assert err["type"] == "ParserError" and err["line"] == 3 and err["source"] == "x = i"
    assert parse_error("warning only\n", None) is None


def test_config_and_missing_inputs_errors():
    with pytest.raises(ValueError, match="normalisation"):
        RewardConfig(normalisation="zscore")
    with pytest.raises(ValueError, match="unknown milestones"):
        RewardConfig(milestones=("data_loaded", "coffee_made"))
    with pytest.raises(ValueError, match="sandbox result"):
        compute_reward(None, instrument_static(CODE), None, None, new_nonce())
    with pytest.raises(ValueError, match="grade report"):
        nonce = new_nonce()
        compute_reward(None, instrument_static(CODE), _exec(stdout=_markers(nonce, ALL)), None,
                       nonce)
