"""scripts/pick_se.py: the test pick change's standard error, recorded or from re-runs."""

import importlib.util
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from configs import task as task_config
from rl4mle_jax import study
from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import prepare_task

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "pick_se.py"
_SPEC = importlib.util.spec_from_file_location("pick_se", _PATH)
script = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(script)

PROGRAM = textwrap.dedent("""\
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    train = pd.read_csv("input/train.csv")
    test = pd.read_csv("input/test.csv")
    cols = {cols}
    model = LogisticRegression(max_iter=500)
    model.fit(train[cols], train["churn"])
    pred = model.predict_proba(test[cols])[:, 1]
    pd.DataFrame({{"id": test["id"], "churn": pred}}).to_csv("submission/submission.csv",
                                                             index=False)
    """)


def test_pick_se_pairs_recorded_and_rerun_replicates(tmp_path, capsys):
    data = tmp_path / "data"
    task = prepare_task("telco-churn", data, reference="recorded")
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    codes = [PROGRAM.format(cols=["tenure"]),
             PROGRAM.format(cols=["tenure", "monthly_charges", "senior_citizen"])]
    sandbox = Sandbox(backend=backend, timeout_s=120, memory_mb=4096)
    grades = [run_and_grade(c, task, sandbox, split="test").grade for c in codes]
    assert all(g.valid and g.score_boot for g in grades)
    config = task_config.get_config()
    config.task, config.data_root, config.env.backend = "telco-churn", str(data), backend
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(config.to_json())
    # The initial evaluation is from before the replicates (its pick is re-run); the final one
    # kept them on its candidate only (found by code and score).
    (run / "eval_initial.json").write_text(json.dumps(
        {"direction": "higher", "pick": {"code": codes[0], "test_score": grades[0].score}}))
    (run / "eval_final.json").write_text(json.dumps(
        {"direction": "higher", "pick": {"code": codes[1], "test_score": grades[1].score},
         "candidates": [{"code": codes[1], "test_split": {
             "status": "valid", "score": grades[1].score,
             "grade": {"score_boot": grades[1].score_boot}}}]}))
    script.main(["pick_se.py", str(run)])
    out = capsys.readouterr().out
    se = study.paired_se(grades[0].score_boot, grades[1].score_boot)
    gain = grades[1].score - grades[0].score
    assert f"change {gain:+.4f} ± {se:.4f} (initial re-run; final recorded)" in out, out
    assert f"mean over 1 runs: {gain:+.4f} ± {se:.4f}" in out, out
    assert 0 < se < np.std(grades[1].score_boot, ddof=1)  # pairing removes the shared part
    # A pick whose re-run does not reproduce its recorded score is never paired.
    (run / "eval_initial.json").write_text(json.dumps(
        {"direction": "higher", "pick": {"code": codes[0], "test_score": 0.5}}))
    script.main(["pick_se.py", str(run)])
    out = capsys.readouterr().out
    assert "not reproducible" in out and "± —" in out, out
    with pytest.raises(FileNotFoundError):
        script.main(["pick_se.py", str(tmp_path / "nothing")])
