"""Demonstration programs: profiling, generation (demos), real sandbox runs (demo_runs),
instrumentation pairs (pairs.py)."""

import ast
import json
import math
import shutil

import pytest

from rl4mle_jax.env.instrument_lm import lm_instrument_prompt, verify_lm_instrumentation
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import load_task, prepare_task
from rl4mle_jax.warmstart import demo_runs, demos
from rl4mle_jax.warmstart import pairs as pairs_lib


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def sandbox():
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    sb = Sandbox(backend=backend, timeout_s=120, memory_mb=4096)
    yield sb
    sb.close()


def _task(task_id, data_root):
    return prepare_task(task_id, data_root, reference="recorded")


@pytest.mark.parametrize("task_id,kind,text,pixels", [
    ("food-reviews", "binary_proba", "review", 0.0),
    ("tweet-source", "class_proba", "text", 0.0),
    ("diamonds-price", "regression", None, 0.0),
    ("meats-composition", "regression", None, 0.0),
    ("digits", "labels", None, 16.0),
])
def test_profile(task_id, kind, text, pixels, data_root):
    task = _task(task_id, data_root)
    p = demos.profile_task(task)
    assert (p.kind, p.text_column, p.pixel_max) == (kind, text, pixels)
    assert p.id_column == task.id_column
    assert set(p.submission_columns) == set(task.target_columns)


@pytest.mark.parametrize("task_id", ["food-reviews", "tweet-source", "diamonds-price",
                                     "leaf-species", "meats-composition", "diamonds-cut"])
def test_generated_programs_are_varied_python(task_id, data_root):
    task = _task(task_id, data_root)
    progs = demos.generate_programs(task, n=10, seed=0)
    assert len(progs) == 10
    assert len({p.code for p in progs}) == 10
    assert len({p.family for p in progs}) >= 3
    for p in progs:
        ast.parse(p.code)
        for path in ("./input/train.csv", "./input/test.csv", "./submission/submission.csv"):
            assert path in p.code
        assert ".fit(" in p.code
        sentences = [s for s in p.plan.split(". ") if s.strip()]
        assert 1 <= len(sentences) <= 3, p.plan
    # Same seed, same programs; another seed, other programs.
    assert [p.code for p in demos.generate_programs(task, n=10, seed=0)] == [p.code for p in progs]
    assert [p.code for p in demos.generate_programs(task, n=10, seed=1)] != [p.code for p in progs]


def test_tradeoff_task_demos_cover_the_fast_and_the_slow_family(data_root):
    # The warm start's demonstrations show both actions of the paper's trade-off (logistic
    # regression, ~2 s; 300 boosting stages, >= 10 s), so duration weighting has both to weigh.
    from rl4mle_jax.warmstart.config import WarmStartConfig

    task = _task("synthetic-tradeoff", data_root)
    progs = demos.generate_programs(task, n=WarmStartConfig().demos_per_task, seed=0)
    families = [p.family for p in progs]
    assert {"logistic", "long_boosting"} <= set(families), families
    slow = next(p for p in progs if p.family == "long_boosting")
    assert "GradientBoostingClassifier(n_estimators=300," in slow.code
    assert "LogisticRegression(" in next(p for p in progs if p.family == "logistic").code
    # Multi-class tasks never get it (one tree per class and stage would pass the demo timeout).
    assert "long_boosting" not in {p.family for p in demos.generate_programs(
        _task("diamonds-cut", data_root), n=20)}


def test_log_target_for_rmsle_and_proba_columns(data_root):
    code = demos.generate_programs(_task("diamonds-price", data_root), n=1)[0].code
    assert "np.log1p(train[target])" in code and "np.expm1(" in code
    code = demos.generate_programs(_task("tweet-source", data_root), n=1)[0].code
    assert "predict_proba" in code and "sample.columns.drop(\"id\")" in code
    code = demos.generate_programs(_task("diamonds-cut", data_root), n=1)[0].code
    assert "model.predict(X_test)" in code and "predict_proba" not in code


def _reference(task, name="baseline"):
    return task.reference_scores.get("reward", {}).get(name)


@pytest.mark.parametrize("task_id,floor", [("food-reviews", 0.75),
                                           ("tweet-source", None)])
def test_demos_run_in_sandbox_and_score_near_reference(task_id, floor, data_root, sandbox):
    task = _task(task_id, data_root)
    progs = demos.generate_programs(task, n=3, seed=0)
    ds = demo_runs.run_demos(task, progs, sandbox, workers=2, timeout_s=120)
    assert [d.code for d in ds] == [p.code for p in progs]
    valid = [d for d in ds if d.valid]
    assert len(valid) >= 2, [(d.family, d.status, d.reason) for d in ds]
    for d in valid:
        assert d.status == "ok" and d.duration_s > 0 and math.isfinite(d.score)
        assert d.reward == (d.score if task.direction == "higher" else -d.score)
        assert "model_trained" in d.milestones and "submission_written" in d.milestones
        assert d.outcome.startswith("No error detected")
    best = max(d.reward for d in valid)
    ref = _reference(task)
    if ref is not None:  # the best demo is at least close to the task's simple baseline
        sign = 1 if task.direction == "higher" else -1
        assert sign * best >= sign * ref - 0.1 * max(abs(ref), 0.1)
    elif floor is not None:
        assert best >= floor
    else:  # log loss: better than the uniform prediction over the classes
        assert -best < math.log(len(task.target_columns))


def test_failed_program_is_kept_with_reason(data_root, sandbox):
    task = _task("food-reviews", data_root)
    prog = demos.generate_programs(task, n=1)[0]
    broken = demos.DemoProgram(prog.plan, prog.code.replace('"review"', '"no_such_column"'),
                               prog.family, prog.params)
    d = demo_runs.run_demo(task, broken, sandbox, timeout_s=60)
    assert not d.valid and d.status == "error" and d.score is None
    assert d.reward == pytest.approx(-10 + 0.1 * len(d.milestones))
    assert "KeyError" in d.reason and "no_such_column" in d.reason
    assert "KeyError" in d.outcome


def test_instrumentation_pairs_are_accepted_by_the_verifier(data_root):
    task = _task("telco-churn", data_root)
    codes = [p.code for p in demos.generate_programs(task, n=4)]
    pairs = pairs_lib.instrumentation_pairs(codes)
    assert len(pairs) == 4
    for code, (prompt, answer) in zip(codes, pairs):
        assert prompt == lm_instrument_prompt(code)
        prog, rec = verify_lm_instrumentation(code, answer)
        assert rec["accepted"], rec
        assert set(prog.milestones) >= {"libraries_imported", "data_loaded", "model_trained",
                                        "predictions_made", "submission_written"}
        stripped = [ln for ln in answer.splitlines() if "@@MILESTONE" not in ln]
        assert "\n".join(stripped[1:-1]) == code.rstrip("\n")


def test_save_load_roundtrip_and_bad_line(tmp_path):
    d = demo_runs.Demo("t", "plan.", "print(1)\n", "logistic", {"C": 1.0}, 1.5, "ok", 0.8, True,
                   None, 0.8, ["model_trained"], "No error detected")
    demo_runs.save_demos(tmp_path / "d.jsonl", [d, d])
    assert demo_runs.load_demos(tmp_path / "d.jsonl") == [d, d]
    assert d.response() == "plan.\n\n```python\nprint(1)\n```"
    (tmp_path / "bad.jsonl").write_text(json.dumps(d.to_json()) + "\n{\"nope\": 1}\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not a demo record"):
        demo_runs.load_demos(tmp_path / "bad.jsonl")


def _hand_task(tmp_path, metric, sample_header="id,y", test_header="id,x"):
    root = tmp_path / "hand"
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    rows = "".join(f"{i},{i * 0.5},{i % 2}\n" for i in range(40))
    (root / "public" / "train.csv").write_text("id,x,y\n" + rows)
    (root / "public" / "test.csv").write_text(
        test_header + "\n" + "".join(f"{i},{i}\n" for i in range(40, 50)))
    (root / "public" / "sample_submission.csv").write_text(
        sample_header + "\n" + "".join(f"{i},0\n" for i in range(40, 50)))
    (root / "private" / "answers.csv").write_text(
        "id,y\n" + "".join(f"{i},{i % 2}\n" for i in range(40, 50)))
    (root / "task.json").write_text(json.dumps(
        {"id": "hand", "metric": metric, "id_column": "id", "target_columns": ["y"]}))
    return load_task(root)


def test_profile_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no demonstration programs for metric 'mean_jaccard'"):
        demos.profile_task(_hand_task(tmp_path / "a", "mean_jaccard"))
    with pytest.raises(ValueError, match=r"test\.csv: id column 'id' missing"):
        demos.profile_task(_hand_task(tmp_path / "b", "auc", test_header="key,x"), split="test")
    with pytest.raises(ValueError, match=r"submission columns \('z',\) are not the label"):
        demos.profile_task(_hand_task(tmp_path / "c", "rmse", sample_header="id,z"))


def test_lm_instrumented_only_teaches_line_level_answers():
    code = ("import numpy as np\nX = np.load('x.npy')\nmodel = Ridge()\n"
            "if model.fit(X, X[:, 0]) is not None:\n    pass\n")
    assert pairs_lib.lm_instrumented(code) is None  # the fit sits in an `if` header: no line spot
    simple = "import numpy as np\nX = np.load('x.npy')\nmodel = Ridge()\nmodel.fit(X, X[:, 0])\n"
    out = pairs_lib.lm_instrumented(simple)
    assert out.splitlines()[1] == 'print("@@MILESTONE libraries_imported")'
    assert 'model.fit(X, X[:, 0])\nprint("@@MILESTONE model_trained")' in out


@pytest.mark.parametrize("task_id", ["tweet-source", "diamonds-cut", "diamonds-price"])
def test_edited_programs_differ_from_their_original_in_one_setting(task_id, data_root):
    task = _task(task_id, data_root)
    plain = demos.generate_programs(task, n=8, seed=0)
    progs = demos.generate_programs(task, n=8, seed=0, edits=5)
    assert [p.code for p in progs[:8]] == [p.code for p in plain]  # the originals unchanged
    edits = progs[8:]
    assert len(edits) == 5 and len({p.code for p in progs}) == 13
    for e in edits:
        o = progs[e.params["edit_of"]]
        assert "edit_of" not in o.params and e.family == o.family
        key = e.params["edited"]
        assert e.params[key] != o.params[key]
        same = {k: v for k, v in e.params.items() if k not in ("edit_of", "edited", key)}
        assert same == {k: v for k, v in o.params.items() if k != key}  # features too
        changed = [(a, b) for a, b in zip(o.code.splitlines(), e.code.splitlines()) if a != b]
        assert len(o.code.splitlines()) == len(e.code.splitlines()) and len(changed) == 1
        ast.parse(e.code)
        assert e.plan != o.plan  # the plan states the setting
    assert demos.generate_programs(task, n=8, seed=0, edits=5) == progs


def test_edit_pairs_go_from_the_weaker_to_the_stronger(data_root):
    from rl4mle_jax.env import prompts
    from rl4mle_jax.warmstart.config import WarmStartConfig

    def demo(code, valid, reward, **params):
        return demo_runs.Demo("t", f"Fit {code}.", f"print({code!r})\n", "logistic", params,
                              1.0, "ok", reward, valid, None, reward, [], f"scored {reward}")

    originals = [demo("a", True, 0.7, C=1.0), demo("b", True, 0.5, C=2.0),
                 demo("c", False, -10.0, C=1.0), demo("d", True, 0.6, C=5.0)]
    edits = [demo("a2", True, 0.8, C=2.0, edit_of=0, edited="C"),   # better: a -> a2
             demo("b2", True, 0.4, C=5.0, edit_of=1, edited="C"),   # worse: b2 -> b
             demo("c2", True, 0.9, C=2.0, edit_of=2, edited="C"),   # original failed: none
             demo("d2", True, 0.6, C=1.0, edit_of=3, edited="C")]   # same reward: none
    got = pairs_lib.edit_pairs(originals, edits)
    assert [(b.code, a.code) for b, a in got] == [(originals[0].code, edits[0].code),
                                                  (edits[1].code, originals[1].code)]
    # In training_pairs: the edited demos are neither solve answers nor random improve pairs;
    # without edits the pairs are those of before.
    task = _task("food-reviews", data_root)
    cfg = WarmStartConfig(instrument_pairs_per_task=0)
    pcfg = prompts.PromptConfig(max_prompt_tokens=4096)
    count = prompts.approx_token_count
    base = pairs_lib.training_pairs(task, originals, ["sklearn"], pcfg, count, cfg)
    both = pairs_lib.training_pairs(task, originals + edits, ["sklearn"], pcfg, count, cfg)
    extra = [p for p in both if p not in base]
    assert [r for _, r, k in extra if k == "improve"] == [edits[0].response(),
                                                         originals[1].response()]
    assert len(both) == len(base) + 2 and set(base) <= set(both)
    assert not {e.response() for e in edits} & {r for _, r, k in both if k == "solve"}
    assert any(f"print({'a'!r})" in p for p, _, k in extra)  # the weaker one is the parent
