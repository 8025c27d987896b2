"""Grader: alignment by id, every named failure reason from a matching bad submission."""

import json

import numpy as np
import pandas as pd
import pytest

from rl4mle_jax.env.grading import REASONS, grade
from rl4mle_jax.env.tasks import load_task

CLASSES = ["cat", "dog", "owl"]


def make_task(root, *, metric, targets, label_column=None, n_train=40, n_test=12, seed=0,
              answers_fn=None, spec_extra=None):
    """A hand-made task directory in our layout (task.json + public/ + private/)."""
    rng = np.random.default_rng(seed)
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    n = n_train + n_test
    ids = np.arange(100, 100 + n)
    x = rng.normal(size=n)
    if label_column:
        labels = np.array(CLASSES)[rng.integers(0, 3, n)]
        full = pd.DataFrame({"id": ids, "x": x, label_column: labels})
        ans = pd.DataFrame({"id": ids, **{c: (labels == c).astype(int) for c in targets}})
    else:
        y = answers_fn(rng, n) if answers_fn else rng.random((n, len(targets))) * 10
        full = pd.DataFrame({"id": ids, "x": x, **{t: y[:, k] for k, t in enumerate(targets)}})
        ans = full[["id", *targets]]
    hidden = [c for c in [label_column, *targets] if c and c in full.columns]
    full.iloc[:n_train].to_csv(root / "public" / "train.csv", index=False)
    full.iloc[n_train:].drop(columns=hidden).to_csv(root / "public" / "test.csv", index=False)
    sample = pd.DataFrame({"id": ids[n_train:], **{t: 1.0 / len(targets) for t in targets}})
    sample.to_csv(root / "public" / "sample_submission.csv", index=False)
    ans.iloc[n_train:].to_csv(root / "private" / "answers.csv", index=False)
    (root / "description.md").write_text("# toy\n")
    spec = dict(id=root.name, metric=metric, id_column="id", target_columns=targets,
                label_column=label_column,
                reference_scores={"test": {"baseline": 1.0}, "reward": {"baseline": 1.1}},
                **(spec_extra or {}))
    (root / "task.json").write_text(json.dumps(spec))
    return load_task(root, data_root=root.parent / "data")


@pytest.fixture
def proba_task(tmp_path):
    return make_task(tmp_path / "toy-proba", metric="log_loss", targets=CLASSES,
                     label_column="animal")


def answers_of(task, split="test"):
    return pd.read_csv(task.answers_path(split))


def write(tmp_path, df, name="sub.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


def perfect(task, split="test"):
    ans = answers_of(task, split)
    return ans[["id", *task.target_columns]].astype({c: float for c in task.target_columns})


def test_perfect_and_aligned_by_id_not_row_order(proba_task, tmp_path):
    sub = perfect(proba_task)
    sub[CLASSES] = sub[CLASSES] * 0.8 + 0.2 / 3
    r1 = grade(proba_task, write(tmp_path, sub, "a.csv"), split="test")
    shuffled = sub.sample(frac=1.0, random_state=1)
    r2 = grade(proba_task, write(tmp_path, shuffled, "b.csv"), split="test")
    assert r1.valid and r2.valid, (r1, r2)
    assert r1.score == r2.score
    ref = -np.log(0.8 + 0.2 / 3)
    assert r1.score == pytest.approx(ref, rel=1e-12)
    # Misaligning values (same ids, values shifted by one row) changes the score.
    wrong = sub.copy()
    wrong[CLASSES] = np.roll(sub[CLASSES].to_numpy(), 1, axis=0)
    assert grade(proba_task, write(tmp_path, wrong, "c.csv"), split="test").score > r1.score


def test_report_json(proba_task, tmp_path):
    rep = grade(proba_task, write(tmp_path, perfect(proba_task)), split="test")
    d = json.loads(rep.to_json())
    assert d["valid"] and d["reason"] is None and d["direction"] == "lower"
    assert d["reference_scores"] == {"baseline": 1.0}
    assert set(d) >= {"score", "direction", "valid", "reason", "message", "reference_scores"}


def test_sample_submission_is_valid(proba_task):
    for split in ("test", "reward"):
        rep = grade(proba_task, proba_task.sample_submission_path(split), split=split)
        assert rep.valid, rep
        assert rep.score == pytest.approx(np.log(3))


def test_slightly_unnormalised_rows_accepted(proba_task, tmp_path):
    sub = perfect(proba_task) * 0.9995 + 0.0001
    sub["id"] = perfect(proba_task)["id"]
    assert grade(proba_task, write(tmp_path, sub), split="test").valid


def _bad(task, tmp_path, fn):
    sub = perfect(task)
    sub[task.target_columns] = sub[task.target_columns] * 0.7 + 0.1
    return fn(sub)


@pytest.mark.parametrize("reason,make", [
    ("missing_columns", lambda s: s.drop(columns=["owl"])),
    ("missing_columns", lambda s: s.drop(columns=["id"])),
    ("extra_columns", lambda s: s.assign(bird=0.0)),
    ("missing_ids", lambda s: s.iloc[:-2]),
    ("missing_ids", lambda s: s.assign(id=s["id"].where(s.index != s.index[0], 99999))),
    ("extra_ids", lambda s: pd.concat([s, s.iloc[:1].assign(id=99999)])),
    ("duplicate_ids", lambda s: pd.concat([s, s.iloc[:1]])),
    ("wrong_row_count", lambda s: s.iloc[:-2].assign(
        id=s["id"].iloc[:-2].where(s.index[:-2] != s.index[0], 99999))),
    ("nan_values", lambda s: s.assign(dog=s["dog"].where(s.index != s.index[3], np.nan))),
    ("inf_values", lambda s: s.assign(dog=s["dog"].where(s.index != s.index[3], np.inf))),
    ("non_numeric_values", lambda s: s.astype({"dog": object}).assign(
        dog=s["dog"].astype(object).where(s.index != s.index[3], "high"))),
    ("prob_out_of_range", lambda s: s.assign(cat=s["cat"] + 1.0, dog=s["dog"] - 1.0)),
    ("prob_rows_not_normalised", lambda s: s.assign(cat=s["cat"] * 0.5)),
])
def test_failure_reasons(proba_task, tmp_path, reason, make):
    rep = grade(proba_task, write(tmp_path, _bad(proba_task, tmp_path, make)), split="test")
    assert not rep.valid and rep.score is None
    assert rep.reason == reason, rep.message
    assert rep.message


def test_no_file_and_unreadable(proba_task, tmp_path):
    rep = grade(proba_task, tmp_path / "nope.csv", split="test")
    assert (rep.valid, rep.reason) == (False, "no_file") and "nope.csv" in rep.message
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert grade(proba_task, empty, split="test").reason == "unreadable_csv"
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b'id,cat,dog,owl\n1,"0.2,0.3\n\xff\xfe\x00\x01')
    rep = grade(proba_task, garbage, split="test")
    assert rep.reason == "unreadable_csv", rep


def test_regression_negative_and_rmsle(tmp_path):
    task = make_task(tmp_path / "toy-rmsle", metric="rmsle", targets=["y"])
    sub = perfect(task)
    rep = grade(task, write(tmp_path, sub), split="test")
    assert rep.valid and rep.score == pytest.approx(0.0, abs=1e-12)
    sub.loc[0, "y"] = -1.0
    rep = grade(task, write(tmp_path, sub), split="test")
    assert rep.reason == "negative_values"


def test_qwk_needs_integers(tmp_path):
    task = make_task(tmp_path / "toy-qwk", metric="qwk", targets=["grade"],
                     answers_fn=lambda rng, n: rng.integers(0, 5, (n, 1)).astype(float))
    sub = perfect(task)
    assert grade(task, write(tmp_path, sub), split="test").score == pytest.approx(1.0)
    sub.loc[0, "grade"] = 2.5
    assert grade(task, write(tmp_path, sub), split="test").reason == "non_integer_values"


def test_accuracy_numeric_labels_compare_as_numbers(tmp_path):
    task = make_task(tmp_path / "toy-acc", metric="accuracy", targets=["digit"],
                     answers_fn=lambda rng, n: rng.integers(0, 10, (n, 1)).astype(int))
    sub = perfect(task)
    sub["digit"] = sub["digit"].astype(float)  # "3.0" in the file, "3" in the answers
    rep = grade(task, write(tmp_path, sub), split="test")
    assert rep.valid and rep.score == 1.0
    sub["digit"] = sub["digit"].astype(object)
    sub.loc[0, "digit"] = ""
    assert grade(task, write(tmp_path, sub), split="test").reason == "nan_values"


def test_metric_error_is_named(tmp_path):
    task = make_task(tmp_path / "toy-auc", metric="auc", targets=["flag"],
                     answers_fn=lambda rng, n: np.ones((n, 1)))  # one class only
    sub = perfect(task).assign(flag=0.5)
    rep = grade(task, write(tmp_path, sub), split="test")
    assert (rep.valid, rep.reason) == (False, "metric_error") and "both classes" in rep.message


def test_duplicate_ids_in_answers_match_by_occurrence(tmp_path):
    """Like detecting-insults (id = comment text, which repeats): repeats match in order."""
    task = make_task(tmp_path / "toy-dup", metric="rmse", targets=["y"])
    ans_p = task.answers_path("test")
    ans = pd.read_csv(ans_p)
    ans.loc[1, "id"] = ans.loc[0, "id"]
    ans.to_csv(ans_p, index=False)
    sub = ans.copy()
    rep = grade(task, write(tmp_path, sub.iloc[::-1]), split="test")
    assert rep.valid and rep.score == pytest.approx(abs(ans.y[0] - ans.y[1]) * np.sqrt(2 / 12))
    rep = grade(task, write(tmp_path, sub.iloc[1:]), split="test")
    assert rep.reason == "missing_ids"


def test_reward_split_grading(proba_task, tmp_path):
    ans = pd.read_csv(proba_task.answers_path("reward"))
    assert len(ans) == 8 and list(ans.columns) == ["id", *CLASSES]  # 20% of 40 train rows
    sub = ans.astype({c: float for c in CLASSES})
    rep = grade(proba_task, write(tmp_path, sub), split="reward")
    assert rep.valid and rep.reference_scores == {"baseline": 1.1}
    # A submission for the test split is not a valid reward submission.
    rep = grade(proba_task, write(tmp_path, perfect(proba_task), "t.csv"), split="reward")
    assert rep.reason in ("wrong_row_count", "missing_ids", "extra_ids")


def test_every_reason_is_covered():
    covered = {"no_file", "unreadable_csv", "missing_columns", "extra_columns",
               "wrong_row_count", "missing_ids", "extra_ids", "duplicate_ids", "nan_values",
               "inf_values", "non_numeric_values", "prob_out_of_range",
               "prob_rows_not_normalised", "negative_values", "non_integer_values",
               "metric_error"}
    # Hostile-input reasons, each with its own test in test_grading_hostile.py.
    covered |= {"not_regular_file", "too_large", "invalid_utf8", "too_many_rows",
                "too_many_columns", "cell_too_long", "ragged_rows", "duplicate_columns",
                "grader_error"}
    assert covered == set(REASONS)


def test_text_metric_jaccard(tmp_path):
    """tweet-sentiment-extraction style: free text, an empty cell is the empty string."""
    root = tmp_path / "toy-text"
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    train = pd.DataFrame({"textID": ["a1", "a2", "a3", "a4", "a5"], "text": ["x y"] * 5,
                          "selected_text": ["x"] * 5})
    train.to_csv(root / "public" / "train.csv", index=False)
    pd.DataFrame({"textID": ["b1", "b2"], "text": ["good day sir", "so bad"]}).to_csv(
        root / "public" / "test.csv", index=False)
    pd.DataFrame({"textID": ["b1", "b2"], "selected_text": ["good day", "bad"]}).to_csv(
        root / "private" / "answers.csv", index=False)
    (root / "task.json").write_text(json.dumps(dict(
        id="toy-text", metric="mean_jaccard", id_column="textID",
        target_columns=["selected_text"], sample_submission_file=None)))
    task = load_task(root, data_root=tmp_path / "data")
    p = tmp_path / "sub.csv"
    p.write_text('textID,selected_text\nb2,\nb1,"Good day, sir"\n')
    rep = grade(task, p, split="test")
    # b1: {good, day,, sir} vs {good, day} -> 1/4 (punctuation stays on words); b2: empty -> 0.
    assert rep.valid and rep.score == pytest.approx((1 / 4 + 0.0) / 2), rep


def test_repeating_and_composite_ids_never_collide(tmp_path):
    """Keys joined as id + "\\x00" + occurrence collide once pandas drops the NUL: id "1"
    occurrence 11 and id "11" occurrence 1 both became "111". Tuples cannot collide."""
    task = make_task(tmp_path / "toy-keys", metric="rmse", targets=["y"], n_test=16)
    ids = ["1"] * 12 + ["11"] * 2 + ["a,b", 'q"x']
    y = np.arange(16, dtype=float) * 10.0
    pd.DataFrame({"id": ids, "y": y}).to_csv(task.answers_path("test"), index=False)
    sub = pd.DataFrame({"id": ids, "y": y}).iloc[[14, 15, 12, 13, *range(12)]]
    rep = grade(task, write(tmp_path, sub), split="test")
    assert rep.valid and rep.score == 0.0, rep
    # Swap the 12th "1" with the 2nd "11": a collision would let this pass as perfect.
    swapped = pd.DataFrame({"id": ids, "y": y})
    swapped.loc[11, "y"], swapped.loc[13, "y"] = y[13], y[11]
    rep = grade(task, write(tmp_path, swapped, "s.csv"), split="test")
    ref = np.sqrt(np.mean((swapped["y"].to_numpy() - y) ** 2))
    assert rep.valid and rep.score == pytest.approx(ref) and rep.score > 0


def test_score_boot_is_a_paired_bootstrap(tmp_path):
    """Valid reports carry the metric on resamples fixed by (task, split, rows): two
    submissions share them, so replicate differences give the paired standard error."""
    from rl4mle_jax.env.grading import BOOTSTRAP_REPLICATES, bootstrap_rows
    from rl4mle_jax.env.metrics import roc_auc

    task = make_task(tmp_path / "toy-auc", metric="auc", targets=["y"], n_test=60,
                     answers_fn=lambda rng, n: rng.integers(0, 2, (n, 1)))
    ans = answers_of(task)
    rng = np.random.default_rng(3)
    a = ans[["id"]].assign(y=(ans["y"] * 0.3 + rng.random(len(ans))) / 1.3)
    b = a.assign(y=np.clip(a["y"] + rng.normal(0, 0.05, len(a)), 0, 1))
    ra = grade(task, write(tmp_path, a, "a.csv"), split="test")
    rb = grade(task, write(tmp_path, b, "b.csv"), split="test")
    assert ra.valid and rb.valid and len(ra.score_boot) == BOOTSTRAP_REPLICATES
    rows = bootstrap_rows(task.id, "test", len(ans))
    np.testing.assert_array_equal(rows, bootstrap_rows(task.id, "test", len(ans)))
    assert not np.array_equal(rows, bootstrap_rows(task.id, "reward", len(ans)))
    y = ans["y"].to_numpy()
    for r, sub in ((ra, a), (rb, b)):
        want = [roc_auc(y[i], sub["y"].to_numpy()[i]) for i in rows]
        np.testing.assert_allclose(r.score_boot, want, rtol=0, atol=1e-12)
        assert json.loads(r.to_json())["score_boot"] == pytest.approx(want)
    # Pairing: two close submissions differ far less on shared resamples than their own spread.
    diff = np.std(np.subtract(ra.score_boot, rb.score_boot), ddof=1)
    assert diff < 0.5 * np.std(ra.score_boot, ddof=1)
    # A resample where the metric is undefined (one class) is NaN, not an error.
    from rl4mle_jax.env.grading import bootstrap_scores
    from rl4mle_jax.env.metrics import get_metric
    y4, p4 = np.array([[1.0], [0.0], [0.0], [0.0]]), np.array([[0.9], [0.2], [0.4], [0.1]])
    got = bootstrap_scores(get_metric("auc"), y4, p4, bootstrap_rows("t", "reward", 4))
    lone = [not (y4[i] == 1).any() or (y4[i] == 1).all() for i in bootstrap_rows("t", "reward", 4)]
    assert any(lone) and not all(lone)
    assert all(np.isnan(g) == lo for g, lo in zip(got, lone))
    assert all(g == 1.0 for g, lo in zip(got, lone) if not lo)
    # Too costly (replicates x one call over the time cap) or too many rows: valid, no replicates.
    import rl4mle_jax.env.grading as grading_lib
    for cap in ("BOOTSTRAP_MAX_S", "BOOTSTRAP_MAX_ROWS"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(grading_lib, cap, 0)
            r = grade(task, write(tmp_path, a, "d.csv"), split="test")
        assert r.valid and r.score == ra.score and r.score_boot is None, cap
    # Invalid: no replicates.
    bad = grade(task, write(tmp_path, a.assign(y="x"), "c.csv"), split="test")
    assert not bad.valid and bad.score_boot is None
