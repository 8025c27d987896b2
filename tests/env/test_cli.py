"""Command line: every command prints JSON; run goes through the sandbox and the grader."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rl4mle_jax.env.__main__ import main
from rl4mle_jax.env.baselines import baseline_path
from rl4mle_jax.env.tasks import list_tasks, load_task, prepare_task


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "rl4mle_tasks"
    for tid in list_tasks():
        prepare_task(tid, root, reference="recorded")
    return root


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_list_and_prepare(data_root, capsys):
    assert main(["--data-root", str(data_root), "list"]) == 0
    rows = _json(capsys)
    assert len(rows) >= 10 and all(r["prepared"] for r in rows)
    assert {r["id"]: r["direction"] for r in rows}["leaf-species"] == "lower"
    assert main(["--data-root", str(data_root), "prepare", "digits", "meats-composition"]) == 0
    out = _json(capsys)
    assert [o["id"] for o in out] == ["digits", "meats-composition"]
    assert out[0]["reference_scores"]["test"]["baseline"] > 0.9


def test_grade(data_root, capsys, tmp_path):
    sample = data_root / "leaf-species" / "reward" / "public" / "sample_submission.csv"
    assert main(["--data-root", str(data_root), "grade", "--task", "leaf-species",
                 "--submission", str(sample)]) == 0
    rep = _json(capsys)
    assert rep["valid"] and rep["split"] == "reward" and rep["direction"] == "lower"
    assert main(["--data-root", str(data_root), "grade", "--task", "leaf-species",
                 "--submission", str(tmp_path / "none.csv"), "--split", "test"]) == 1
    rep = _json(capsys)
    assert (rep["valid"], rep["reason"]) == (False, "no_file")


def test_unknown_task_is_a_json_error(data_root, capsys, tmp_path):
    assert main(["--data-root", str(data_root), "grade", "--task", "nope",
                 "--submission", str(tmp_path / "x.csv")]) == 2
    assert _json(capsys)["error"] == "TaskSpecError"


def test_run_through_sandbox(data_root, capsys):
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    rc = main(["--data-root", str(data_root), "run", "--task", "digits",
               str(baseline_path("digits")), "--split", "test", "--timeout", "120",
               "--backend", backend])
    out = _json(capsys)
    assert rc == 0, out
    assert out["exec"]["status"] == "ok" and out["exec"]["duration_s"] > 0
    assert out["grade"]["valid"] and out["grade"]["score"] > 0.9
    assert out["grade"]["reference_scores"]["baseline"] == pytest.approx(out["grade"]["score"],
                                                                          abs=0.01)


def test_module_entry_point(data_root):
    env = {**os.environ, "RL4MLE_DATA": str(data_root)}
    proc = subprocess.run([sys.executable, "-m", "rl4mle_jax.env", "list"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == len(list_tasks())


def test_env_never_imports_jax():
    # Every module of the environment package, the sandbox's included (the baseline scripts
    # in env/baselines/ are programs run in the sandbox, never imported).
    code = ("import importlib, pkgutil, sys, rl4mle_jax.env as env; "
            "names = [m.name for m in pkgutil.walk_packages(env.__path__, 'rl4mle_jax.env.') "
            "if not m.name.startswith('rl4mle_jax.env.baselines.')]; "
            "[importlib.import_module(n) for n in names]; "
            "assert len(names) > 30, names; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- run --keep DIR: the run dir is deleted, so what is worth keeping is copied out -------------
KEEP_PROGRAM = """\
import hashlib
import pandas as pd
from sklearn.linear_model import LogisticRegression

train = pd.read_csv("input/train.csv")
test = pd.read_csv("input/test.csv")
pixels = [c for c in test.columns if c.startswith("pixel")]
model = LogisticRegression(max_iter=300).fit(train[pixels] / 16.0, train["label"])
pd.DataFrame({"id": test["id"], "label": model.predict(test[pixels] / 16.0)}).to_csv(
    "submission/submission.csv", index=False)
print("sha256", hashlib.sha256(open("submission/submission.csv", "rb").read()).hexdigest())
"""


def _run(data_root, script, *extra):
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    return main(["--data-root", str(data_root), "run", "--task", "digits", str(script),
                 "--timeout", "120", "--backend", backend, "--instrument", "static", *extra])


def test_run_keep_writes_the_graded_bytes_output_program_and_record(data_root, capsys,
                                                                    tmp_path):
    import hashlib

    script = tmp_path / "prog.py"
    script.write_text(KEEP_PROGRAM)
    keep = tmp_path / "kept" / "run1"  # missing, parents too: created
    rc = _run(data_root, script, "--keep", str(keep))
    out = _json(capsys)
    assert rc == 0, out
    assert sorted(p.name for p in keep.iterdir()) == out["kept"]["files"] == [
        "program.py", "record.json", "stderr.txt", "stdout.txt", "submission.csv"]
    assert out["kept"]["dir"] == str(keep) and out["exec"]["workdir"] is None
    assert out["exec"]["submission_path"] == str(keep / "submission.csv")
    kept = (keep / "submission.csv").read_bytes()
    # The bytes the program wrote (it printed their digest) are the bytes that were graded.
    assert f"sha256 {hashlib.sha256(kept).hexdigest()}" in (keep / "stdout.txt").read_text()
    assert out["grade"]["valid"] and out["grade"]["n_rows"] == kept.count(b"\n") - 1
    program = (keep / "program.py").read_text()
    assert out["nonce"] in program and "LogisticRegression(max_iter=300)" in program
    assert json.loads((keep / "record.json").read_text()) == out


def test_run_keep_of_a_link_to_the_answers_keeps_no_answers(data_root, capsys, tmp_path):
    answers = load_task("digits", data_root=data_root).answers_path("test")
    script = tmp_path / "link.py"
    script.write_text("import os\nfrom sklearn.linear_model import LogisticRegression\n"
                      "LogisticRegression().fit([[0], [1]], [0, 1])\n"
                      f"os.symlink({str(answers)!r}, 'submission/submission.csv')\n"
                      "print('linked')\n")
    keep = tmp_path / "kept"
    rc = _run(data_root, script, "--keep", str(keep), "--split", "test")
    printed = capsys.readouterr().out
    out = json.loads(printed)
    assert rc == 1 and out["grade"]["reason"] == "not_regular_file", out["grade"]
    assert out["exec"]["submission_path"] is None  # nothing safe to keep, so no path
    assert sorted(p.name for p in keep.iterdir()) == [
        "program.py", "record.json", "stderr.txt", "stdout.txt"]
    assert not any(p.is_symlink() for p in keep.iterdir())
    assert "linked" in (keep / "stdout.txt").read_text()  # the link was made, then refused
    kept_text = printed + "".join(p.read_text() for p in keep.iterdir())
    for line in answers.read_text().splitlines()[1:6]:
        assert line not in kept_text, line


def test_run_without_keep_reports_no_deleted_path(data_root, capsys, tmp_path, monkeypatch):
    script = tmp_path / "prog.py"
    script.write_text(KEEP_PROGRAM)
    monkeypatch.setenv("RL4MLE_SANDBOX_ROOT", str(tmp_path / "runs"))
    assert _run(data_root, script) == 0
    out = _json(capsys)
    assert out["kept"] is None
    assert out["exec"]["submission_path"] is None and out["exec"]["workdir"] is None
    assert str(tmp_path / "runs") not in json.dumps(out)  # the run dir is gone: never named


@pytest.mark.parametrize("make", ["file_inside", "plain_file"])
def test_run_keep_refuses_a_non_empty_dir_before_running(data_root, capsys, tmp_path, make):
    keep = tmp_path / "kept"
    if make == "file_inside":
        keep.mkdir()
        (keep / "old.txt").write_text("from an earlier run")
    else:
        keep.write_text("not a directory")
    script = tmp_path / "prog.py"
    script.write_text("open('submission/submission.csv', 'w').write('ran')\n")
    assert _run(data_root, script, "--keep", str(keep)) == 2
    err = _json(capsys)
    assert err["error"] == "FileExistsError" and str(keep) in err["message"], err
    if make == "file_inside":
        assert "not empty" in err["message"]
        assert [p.name for p in keep.iterdir()] == ["old.txt"]
    else:
        assert keep.read_text() == "not a directory"
