"""Command line: every command prints JSON; run goes through the sandbox and the grader."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rl4mle_jax.env.__main__ import main
from rl4mle_jax.env.baselines import baseline_path
from rl4mle_jax.env.tasks import list_tasks, prepare_task


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
