"""Local suite preparation, reward split, checksums, task.json validation, MLE-bench layout."""

import json
import time

import numpy as np
import pandas as pd
import pytest

from rl4mle_jax.env import mlebench
from rl4mle_jax.env.datasets import REGISTRY
from rl4mle_jax.env.datasets.splits import split_indices, verify_checksums
from rl4mle_jax.env.grading import grade
from rl4mle_jax.env.metrics import METRICS
from rl4mle_jax.env.tasks import (
    TaskSpecError,
    list_tasks,
    load_task,
    prepare_task,
    select_index,
    select_splits,
)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """All local tasks prepared once per session (later modules reuse them: prepare is
    idempotent)."""
    root = tmp_path_factory.getbasetemp() / "rl4mle_tasks"
    for tid in list_tasks():
        prepare_task(tid, root, reference="recorded")
    return root


def test_suite_covers_the_paper_task_types():
    tasks = list_tasks()
    assert len(tasks) >= 10
    metrics = {REGISTRY[t].metric for t in tasks}
    assert {"auc", "log_loss", "accuracy", "rmsle", "rmse"} <= metrics
    kinds = {t: REGISTRY[t].kind for t in tasks}
    assert kinds["food-reviews"] == "binary" and kinds["tweet-source"] == "proba"
    assert len(REGISTRY["leaf-species"].targets) == 32
    assert {"digits", "mnist"} <= set(tasks)
    assert sum(len(REGISTRY[t].targets) >= 3 for t in tasks) >= 2  # several-column submissions


@pytest.mark.parametrize("tid", sorted(REGISTRY))
def test_prepared_layout_and_reward_split(data_root, tid):
    task = load_task(data_root / tid)
    assert task.id == tid and task.metric in METRICS
    pub, priv = task.input_dir("test"), task.answers_path("test")
    rew = task.input_dir("reward")
    names = {"train.csv", "test.csv", "sample_submission.csv", "description.md"}
    assert names <= {p.name for p in pub.iterdir()}
    assert {p.name for p in rew.iterdir()} == {p.name for p in pub.iterdir()}
    # Answers never inside the directory the program sees.
    for split in ("reward", "test"):
        ans = task.answers_path(split)
        assert not ans.resolve().is_relative_to(task.input_dir(split).resolve())
    assert "## Evaluation" in task.description and "submission.csv" in task.description

    train, test = pd.read_csv(pub / "train.csv"), pd.read_csv(pub / "test.csv")
    hidden = set(task.target_columns) | {task.label_column} - {None}
    assert not hidden & set(test.columns), "targets leaked into test.csv"
    ans = pd.read_csv(priv)
    assert sorted(ans["id"]) == sorted(test["id"])
    assert set(train["id"]).isdisjoint(test["id"])
    sample = pd.read_csv(pub / "sample_submission.csv")
    assert list(sample.columns) == ["id", *task.target_columns]

    r_train, r_test = pd.read_csv(rew / "train.csv"), pd.read_csv(rew / "test.csv")
    r_ans = pd.read_csv(task.answers_path("reward"))
    assert set(r_train["id"]).isdisjoint(r_test["id"])
    assert set(r_train["id"]) | set(r_test["id"]) == set(train["id"])
    assert len(r_test) == round(0.2 * len(train))
    assert sorted(r_ans["id"]) == sorted(r_test["id"])
    assert list(r_test.columns) == list(test.columns)
    assert list(pd.read_csv(rew / "sample_submission.csv").columns) == list(sample.columns)
    # Both sample submissions are valid submissions.
    for split in ("reward", "test"):
        assert grade(task, task.sample_submission_path(split), split).valid


def test_checksums_recorded_and_verified(data_root):
    root = data_root / "meats-composition"
    sums = json.loads((root / "checksums.json").read_text())
    assert {"public/train.csv", "private/answers.csv", "reward/private/answers.csv"} <= set(sums)
    assert verify_checksums(root, sums) == []
    assert load_task(root).verify() == []


def test_prepare_idempotent_and_fast(data_root):
    t0 = time.monotonic()
    for tid in list_tasks():
        prepare_task(tid, data_root, reference="recorded")
    assert time.monotonic() - t0 < 5.0
    mtime = (data_root / "digits" / "public" / "train.csv").stat().st_mtime_ns
    prepare_task("digits", data_root, reference="recorded")
    assert (data_root / "digits" / "public" / "train.csv").stat().st_mtime_ns == mtime


def test_prepare_deterministic_and_repairs_tampering(data_root, tmp_path):
    a = json.loads((data_root / "meats-composition" / "checksums.json").read_text())
    prepare_task("meats-composition", tmp_path, reference="recorded")
    root = tmp_path / "meats-composition"
    assert json.loads((root / "checksums.json").read_text()) == a
    answers = root / "reward" / "private" / "answers.csv"
    answers.write_text(answers.read_text().replace("1", "2"))
    assert verify_checksums(root, a) == ["reward/private/answers.csv"]
    assert load_task(root).verify() == ["reward/private/answers.csv"]
    prepare_task("meats-composition", tmp_path, reference="recorded")
    assert verify_checksums(root, a) == []


def test_reference_scores_recorded(data_root):
    for tid in list_tasks():
        refs = load_task(data_root / tid).reference_scores
        assert set(refs) == {"reward", "test"}, f"{tid}: no recorded reference scores {refs}"
        assert "baseline" in refs["reward"] and "baseline" in refs["test"]


# --- task.json validation --------------------------------------------------------------------

def _handmade(root, **spec_over):
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    pd.DataFrame({"id": [1, 2, 3, 4, 5], "x": [1.0, 2, 3, 4, 5], "y": [0, 1, 0, 1, 1]}).to_csv(
        root / "public" / "train.csv", index=False)
    pd.DataFrame({"id": [6, 7], "x": [1.5, 2.5]}).to_csv(root / "public" / "test.csv",
                                                          index=False)
    pd.DataFrame({"id": [6, 7], "y": [0, 1]}).to_csv(root / "private" / "answers.csv",
                                                     index=False)
    spec = {"id": "hand", "metric": "auc", "id_column": "id", "target_columns": ["y"],
            **spec_over}
    spec = {k: v for k, v in spec.items() if v is not None}
    (root / "task.json").write_text(json.dumps(spec))
    return root


@pytest.mark.parametrize("over,needle", [
    (dict(metric=None), "missing required field 'metric'"),
    (dict(metric="f1"), "field 'metric' must be one of"),
    (dict(direction="up"), "field 'direction' must be 'higher' or 'lower'"),
    (dict(target_columns=[]), "field 'target_columns' must be a non-empty list"),
    (dict(target_columns="y"), "field 'target_columns' must be a list"),
    (dict(timeout_s=-1), "field 'timeout_s' must be a positive number"),
    (dict(answers_file="nope.csv"), "answers file"),
    (dict(reward_fraction=1.5), "field 'reward_fraction'"),
])
def test_task_json_errors_name_the_field(tmp_path, over, needle):
    root = _handmade(tmp_path / "hand", **over)
    with pytest.raises(TaskSpecError) as e:
        load_task(root)
    assert needle in str(e.value) and "task.json" in str(e.value), str(e.value)


def test_handmade_task_loads_and_reward_split(tmp_path):
    root = _handmade(tmp_path / "hand")
    task = load_task(root, data_root=tmp_path / "data")
    assert task.direction == "higher" and task.timeout_s == 300
    assert (task.input_dir("reward") / "train.csv").exists()
    # Derived files never go into the user's directory.
    assert task.input_dir("reward").is_relative_to(tmp_path / "data" / "derived")
    assert not (root / "reward").exists()
    bad = tmp_path / "notatask"
    bad.mkdir()
    with pytest.raises(TaskSpecError, match="not a task directory"):
        load_task(bad)
    (root / "task.json").write_text("{not json")
    with pytest.raises(TaskSpecError, match="task.json: not valid JSON"):
        load_task(root)
    with pytest.raises(TaskSpecError, match="unknown task 'no-such-task'"):
        load_task("no-such-task", data_root=tmp_path / "data")


def test_split_folds_are_blocks_of_one_permutation_then_draws_outside_fold_0():
    """NumPy reference for `split_indices(n, f, seed, fold)`: fold k holds out block k of the
    seed's permutation while k+1 blocks fit; past that, n_hold rows drawn with seed + k from
    the rows outside fold 0 (all of them where fewer remain)."""
    n, f, seed = 23, 0.2, 7
    perm = np.random.default_rng(seed).permutation(n)
    folds = [split_indices(n, f, seed, k) for k in range(6)]
    for k, (keep, hold) in enumerate(folds):
        assert len(hold) == 5 and sorted([*keep, *hold]) == list(range(n))
        assert list(keep) == sorted(keep) and list(hold) == sorted(hold)
        if k < 4:  # 4 blocks of 5 fit in 23 rows
            assert set(hold) == set(perm[5 * k:5 * (k + 1)])
        else:
            rest = perm[5:]
            draw = rest[np.random.default_rng(seed + k).permutation(len(rest))[:5]]
            assert set(hold) == set(draw)
        assert not set(hold) & set(folds[0][1]) or k == 0
    assert len(set().union(*(set(h) for _, h in folds[:4]))) == 20  # pairwise disjoint
    np.testing.assert_array_equal(split_indices(n, f, seed)[1], folds[0][1])
    with pytest.raises(ValueError, match="fold"):
        split_indices(n, f, seed, -1)
    keep0, hold0 = split_indices(10, 0.6, seed)
    for k in (1, 2):  # 6 of 10 held out by fold 0: the other 4 are every later fold's answers
        keep, hold = split_indices(10, 0.6, seed, k)
        np.testing.assert_array_equal(hold, keep0)
        np.testing.assert_array_equal(keep, hold0)


def test_selection_splits_are_more_carves_beside_the_reward_view(tmp_path):
    """"select<k>": public train carved like the reward split (same share held out), its
    answers the k-th next block of the reward split's permutation (disjoint from the reward
    split's and each other's), beside the reward view (out of the user's directory), graded
    like it."""
    root = _handmade(tmp_path / "hand")
    n = 40
    pd.DataFrame({"id": range(1, n + 1), "x": np.arange(n) / 2, "y": np.arange(n) % 2}).to_csv(
        root / "public" / "train.csv", index=False)
    task = load_task(root, data_root=tmp_path / "data")
    assert select_splits(3) == ["select1", "select2", "select3"]
    assert [select_index(s) for s in ("select1", "select12", "select0", "select01", "selectx",
                                      "reward", "test")] == [1, 12, None, None, None, None, None]
    for bad in ("select0", "select", "fold1", "validation"):
        with pytest.raises(ValueError, match="selection split"):
            task.input_dir(bad)
    train = pd.read_csv(root / "public" / "train.csv")
    held = {}
    for sp in ("reward", "select1", "select2"):
        ans = pd.read_csv(task.answers_path(sp))
        pub = pd.read_csv(task.input_dir(sp) / "train.csv")
        assert task.input_dir(sp).is_relative_to(tmp_path / "data" / "derived")
        assert len(ans) == round(len(train) * task.reward_fraction)
        assert len(ans) + len(pub) == len(train)
        assert not set(ans[task.id_column]) & set(pub[task.id_column])
        held[sp] = set(ans[task.id_column])
        keep, hold = split_indices(len(train), task.reward_fraction, task.reward_seed,
                                   select_index(sp) or 0)
        assert held[sp] == set(train[task.id_column].iloc[hold])
    # NumPy reference: blocks 0, 1, 2 of the reward seed's permutation, so the answers are
    # pairwise disjoint (the reward split is the one it always was)
    perm = np.random.default_rng(task.reward_seed).permutation(n)
    for k, sp in enumerate(("reward", "select1", "select2")):
        assert held[sp] == set(train[task.id_column].iloc[perm[8 * k:8 * (k + 1)]])
    assert not held["reward"] & held["select1"] and not held["select1"] & held["select2"]
    assert task.input_dir("select1").parent.parent == task.input_dir("reward").parent.parent
    assert not (root / "reward").exists() and not (root / "select1").exists()
    # graded against its own answers
    sub = pd.read_csv(task.answers_path("select1"))
    path = tmp_path / "perfect.csv"
    sub.to_csv(path, index=False)
    rep = grade(task, path, split="select1")
    assert rep.valid and rep.split == "select1" and rep.n_rows == len(sub)
    assert rep.score == 1.0
    assert not grade(task, path, split="reward").valid  # other rows: not a submission there
    with pytest.raises(ValueError, match="not carved"):
        task.ensure_reward_split("test")


# --- MLE-bench prepared layout ---------------------------------------------------------------

def _mlebench_spooky(base, n_train=50, n_test=10):
    rng = np.random.default_rng(0)
    root = base / "spooky-author-identification"
    pub, priv = root / "prepared" / "public", root / "prepared" / "private"
    pub.mkdir(parents=True)
    priv.mkdir(parents=True)
    authors = np.array(["EAP", "HPL", "MWS"])[rng.integers(0, 3, n_train + n_test)]
    ids = [f"id{i:05d}" for i in rng.permutation(99999)[: n_train + n_test]]
    text = [f"text {i} of {a.lower()}" for i, a in enumerate(authors)]
    df = pd.DataFrame({"id": ids, "text": text, "author": authors})
    df.iloc[:n_train].to_csv(pub / "train.csv", index=False)
    df.iloc[n_train:][["id", "text"]].to_csv(pub / "test.csv", index=False)
    pd.DataFrame({"id": ids[n_train:], "EAP": 0.403, "HPL": 0.287, "MWS": 0.31}).to_csv(
        pub / "sample_submission.csv", index=False)
    onehot = pd.DataFrame({"id": ids[n_train:], **{a: (authors[n_train:] == a).astype(int)
                                                    for a in ["EAP", "HPL", "MWS"]}})
    onehot.to_csv(priv / "test.csv", index=False)
    (pub / "description.md").write_text("# Spooky Author Identification\n")
    return root, onehot


def test_mlebench_layout_loads_and_grades(tmp_path):
    root, answers = _mlebench_spooky(tmp_path / "mle-bench")
    task = load_task(root, data_root=tmp_path / "data")
    assert task.layout == "mlebench" and task.metric == "log_loss"
    assert task.target_columns == ["EAP", "HPL", "MWS"] and task.answers_file == "test.csv"
    assert task.description.startswith("# Spooky")
    sub = answers.astype({c: float for c in ["EAP", "HPL", "MWS"]})
    p = tmp_path / "sub.csv"
    sub.to_csv(p, index=False)
    rep = grade(task, p, split="test")
    assert rep.valid and rep.score == pytest.approx(-np.log(1 - 1e-15), abs=1e-12)
    # Reward view: derived under the data root, the user's MLE-bench copy untouched.
    rew = task.input_dir("reward")
    assert rew.is_relative_to(tmp_path / "data" / "derived")
    assert sorted(p.name for p in (root / "prepared").iterdir()) == ["private", "public"]
    r_ans = pd.read_csv(task.answers_path("reward"))
    r_train = pd.read_csv(rew / "train.csv")
    assert list(r_ans.columns) == ["id", "EAP", "HPL", "MWS"] and len(r_ans) == 10
    assert list(pd.read_csv(rew / "test.csv").columns) == ["id", "text"]
    full = pd.read_csv(root / "prepared" / "public" / "train.csv").set_index("id")
    for _, row in r_ans.iterrows():  # one-hot agrees with the held-out author labels
        assert row[full.loc[row["id"], "author"]] == 1
    assert set(r_train["id"]).isdisjoint(r_ans["id"])
    r_sample = task.sample_submission_path("reward")
    assert grade(task, r_sample, split="reward").valid
    # Validation knows the layout too (the spec from mlebench.py, label column included).
    from rl4mle_jax.env.validate import validate_task

    check = validate_task(root, data_root=tmp_path / "data")
    assert check.ok and check.task_id == "spooky-author-identification", check.problems
    assert sorted(p.name for p in (root / "prepared").iterdir()) == ["private", "public"]


def test_mlebench_id_and_json_train(tmp_path, monkeypatch):
    """Load by competition id via $MLEBENCH_DATA; random-acts-of-pizza has JSON train/test."""
    base = tmp_path / "mle-bench"
    root = base / "random-acts-of-pizza"
    pub, priv = root / "prepared" / "public", root / "prepared" / "private"
    pub.mkdir(parents=True)
    priv.mkdir(parents=True)
    recs = [{"request_id": f"t3_{i}", "request_text": f"pizza {i}", "upvotes": i,
             "requester_received_pizza": bool(i % 3 == 0)} for i in range(40)]
    (pub / "train.json").write_text(json.dumps(recs[:30]))
    (pub / "test.json").write_text(json.dumps([{k: r[k] for k in ("request_id", "request_text")}
                                               for r in recs[30:]]))
    (pub / "train.json.zip").write_bytes(b"archive with labels")
    pd.DataFrame({"request_id": [r["request_id"] for r in recs[30:]],
                  "requester_received_pizza": 0}).to_csv(pub / "sampleSubmission.csv",
                                                         index=False)
    pd.DataFrame({"request_id": [r["request_id"] for r in recs[30:]],
                  "requester_received_pizza": [int(r["requester_received_pizza"])
                                               for r in recs[30:]]}).to_csv(
        priv / "test.csv", index=False)
    monkeypatch.setenv("MLEBENCH_DATA", str(base))
    task = load_task("random-acts-of-pizza", data_root=tmp_path / "data")
    assert task.train_file == "train.json" and task.metric == "auc"
    rew = task.input_dir("reward")
    assert sorted(p.name for p in rew.iterdir()) == ["sampleSubmission.csv", "test.json",
                                                     "train.json"]  # label archive left out
    r_test = json.loads((rew / "test.json").read_text())
    assert set(r_test[0]) == {"request_id", "request_text"}
    r_ans = pd.read_csv(task.answers_path("reward"))
    assert set(r_ans["requester_received_pizza"]) <= {0, 1} and len(r_ans) == 6
    sub = r_ans.assign(requester_received_pizza=r_ans["requester_received_pizza"] * 0.9)
    p = tmp_path / "sub.csv"
    sub.to_csv(p, index=False)
    assert grade(task, p, split="reward").score == 1.0


def test_mlebench_specs():
    assert len(mlebench.PAPER_COMPETITIONS) == 10
    assert {"us-patent-phrase-to-phrase-matching", "plant-pathology-2020-fgvc7"} <= set(
        mlebench.PAPER_COMPETITIONS)
    for cid, spec in mlebench.SPECS.items():
        assert spec["metric"] in METRICS, cid
        assert spec["answers_file"] in ("test.csv", "answers.csv"), cid
    with pytest.raises(TaskSpecError, match="no task.json and no MLE-bench spec"):
        mlebench.spec_for("some-other-competition", __import__("pathlib").Path("/tmp"))


def test_listing_and_loading_by_id_do_not_import_the_builders():
    import subprocess
    import sys

    code = ("import sys; from rl4mle_jax.env import tasks; ids = tasks.list_tasks(); "
            "assert 'food-reviews' in ids; "
            "bad = [m for m in sys.modules if 'datasets' in m or 'baselines' in m]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    from rl4mle_jax.env.datasets import REGISTRY
    from rl4mle_jax.env.suite import local_task_ids

    assert sorted(REGISTRY) == local_task_ids()


def test_tradeoff_task_is_seeded_and_records_the_papers_trade_off():
    from rl4mle_jax.env.datasets.reference_scores import RECORDED

    d = REGISTRY["synthetic-tradeoff"]
    pd.testing.assert_frame_equal(d.load().frame, d.load().frame)
    rec = RECORDED["synthetic-tradeoff"]
    for split in ("reward", "test"):  # measured by `calibrate` in the sandbox (cpus=1)
        assert rec[split]["strong"] - rec[split]["baseline"] >= 0.05, rec[split]
        assert rec["runtime_s"][split]["strong"] >= 10.0, rec["runtime_s"]
        assert rec["runtime_s"][split]["strong"] >= 5 * rec["runtime_s"][split]["baseline"]
