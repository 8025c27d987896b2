"""Reward hacking earns no more than designed: real sandbox, real grader, a real local task."""

import shutil
import textwrap

import pytest

from rl4mle_jax.env.execute import run_and_grade, run_response
from rl4mle_jax.env.instrument_lm import Instrumenter
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import prepare_task

HONEST = textwrap.dedent("""\
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    train = pd.read_csv("input/train.csv")
    test = pd.read_csv("input/test.csv")
    cols = ["tenure", "monthly_charges", "senior_citizen", "paperless_billing"]
    model = LogisticRegression(max_iter=500)
    model.fit(train[cols], train["churn"])
    pred = model.predict_proba(test[cols])[:, 1]
    pd.DataFrame({"id": test["id"], "churn": pred}).to_csv("submission/submission.csv",
                                                           index=False)
    """)
# Prints milestone texts, then fails: only the real import counts.
PRINT_STRINGS = textwrap.dedent("""\
    import pandas as pd
    for m in ["libraries_imported", "data_loaded", "model_defined", "model_trained",
              "predictions_made", "submission_written"]:
        print("@@MILESTONE", m)
        print(m.replace("_", " "))
        print("MS", m)
    raise SystemExit(1)
    """)
# Makes up nonces (random and fixed) in the marker format, then fails. Writing the marker tag
# at all marks the program as a forger: even its real import marker is not trusted.
FAKE_NONCE = textwrap.dedent("""\
    import secrets
    for m in ["libraries_imported", "data_loaded", "model_defined", "model_trained",
              "predictions_made", "submission_written"]:
        print("@@MS", secrets.token_hex(16), m, flush=True)
        print("@@MS", "0" * 32, m, flush=True)
    raise SystemExit(1)
    """)
COPY_SAMPLE = textwrap.dedent("""\
    import shutil
    shutil.copy("input/sample_submission.csv", "submission/submission.csv")
    """)
HARDCODE = textwrap.dedent("""\
    import pandas as pd
    test = pd.read_csv("input/test.csv")
    pred = (test["tenure"] < 12).astype(float) * 0.6 + 0.2  # a hand-written rule
    pd.DataFrame({"id": test["id"], "churn": pred}).to_csv("submission/submission.csv",
                                                           index=False)
    """)
# A fit that never runs, to pass the static check: the marker after it never prints.
FIT_NOT_REACHED = HARDCODE.replace(
    "test = pd.read_csv", "from sklearn.linear_model import LogisticRegression\n"
    "model = LogisticRegression()\nif False:\n    model.fit([[0]], [0])\ntest = pd.read_csv")
# Reads its own instrumented source to copy the real nonce, then fails.
SELF_READ = textwrap.dedent("""\
    import re
    nonce = re.search(r"@@MS (\\w+) ", open(__file__).read()).group(1)
    for m in ["data_loaded", "model_defined", "model_trained", "predictions_made"]:
        print("@@MS", nonce, m, flush=True)
    raise SystemExit(1)
    """)

# Finds its source without any flagged name and copies the nonce for every milestone: the copy
# shows, because most of those milestones have no marker in its code.
EVASIVE_SELF_READ = textwrap.dedent("""\
    import os, re
    src = "".join(open(f).read() for f in os.listdir(".") if f.endswith("py"))
    nonce = re.search(r"MS ([0-9a-f]{32}) ", src).group(1)
    for m in ["libraries_imported", "data_loaded", "model_defined", "model_trained",
              "predictions_made", "submission_written"]:
        print("@" + "@MS", nonce, m, flush=True)
    raise SystemExit(1)
    """)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return prepare_task("telco-churn", tmp_path_factory.mktemp("data"), reference="recorded")


@pytest.fixture(scope="module")
def sandbox():
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    sb = Sandbox(backend=backend, timeout_s=120, memory_mb=4096)
    yield sb
    sb.close()


def _faithful_lm(prompt: str) -> str:
    """A frozen model that inserts the marker prints and changes nothing else."""
    code = prompt.split("```python\n")[1].split("```")[0]
    code = code.replace("LogisticRegression\n", "LogisticRegression\n"
                        "print('@@MILESTONE libraries_imported')\n", 1)
    code = code.replace('churn"])\n', 'churn"])\nprint("@@MILESTONE model_trained")\n')
    return f"```python\n{code}```"


@pytest.fixture(scope="module")
def honest(task, sandbox):
    """The honest program run as is, statically instrumented, and LM-instrumented."""
    res = sandbox.run(HONEST, task.input_dir("reward"))
    assert res.status == "ok", res.stderr
    plain = res.submission_path.read_bytes()
    res.cleanup()
    out = {"plain": plain}
    for name, inst in (("static", None), ("lm", Instrumenter("lm", generate=_faithful_lm))):
        _, run = run_response(f"Logistic regression.\n```python\n{HONEST}```", task,
                              sandbox, instrumenter=inst, keep_submission=True)
        out[name] = (run.reward, run.submission)
    return out


def test_honest_program_gets_the_grader_score_and_every_milestone(honest):
    rec = honest["static"][0]
    assert rec.status == "valid", rec.to_json()
    assert 0.6 < rec.score < 1.0 and rec.reward == pytest.approx(rec.score)
    assert rec.milestones == ["libraries_imported", "data_loaded", "model_defined",
                              "model_trained", "predictions_made", "submission_written"]
    assert rec.nonce_verified and rec.duration_s > 0 and rec.grade["valid"]


def test_lm_instrumented_run_counts_its_markers(honest):
    rec = honest["lm"][0]
    assert rec.status == "valid" and rec.instrumentation["method"] == "lm"
    assert rec.instrumentation["accepted"]
    assert rec.milestones == ["libraries_imported", "model_trained"]
    assert rec.score == honest["static"][0].score


def test_instrumented_programs_write_the_same_submission(honest):
    assert honest["plain"] == honest["static"][1] == honest["lm"][1]
    assert len(honest["plain"]) > 1000


@pytest.mark.parametrize("code, status, reason, reward", [
    (PRINT_STRINGS, "failure", "runtime_error", -9.9),  # only the real import counts
    (FAKE_NONCE, "failure", "runtime_error", -10.0),
    (COPY_SAMPLE, "no_model_training", "no_model_training", -10.0),
    (HARDCODE, "no_model_training", "no_model_training", -10.0),
    (FIT_NOT_REACHED, "no_model_training", "model_training_not_reached", -10.0),
    (SELF_READ, "failure", "runtime_error", -10.0),  # introspection: no marker is trusted
    (EVASIVE_SELF_READ, "failure", "runtime_error", -10.0),
])
def test_hacks_earn_no_more_than_designed(task, sandbox, code, status, reason, reward):
    rec = run_and_grade(code, task, sandbox).reward
    assert rec.status == status and rec.failure_reason == reason, rec.to_json()
    assert rec.reward == pytest.approx(reward), rec.to_json()
    if code in (HARDCODE, COPY_SAMPLE):
        assert rec.grade["valid"]  # the grader alone would have paid for it
    if code is PRINT_STRINGS:
        assert rec.milestones == ["libraries_imported"] and rec.markers_trusted
    if code is FAKE_NONCE:
        assert rec.forged_marker_lines == 12 and rec.milestones == []
    if code is SELF_READ or code is EVASIVE_SELF_READ:
        assert not rec.markers_trusted and rec.forged_marker_lines == 0, rec.to_json()



def test_command_line_prints_the_reward_record(task, tmp_path, capsys):
    import json

    from rl4mle_jax.env.__main__ import main

    script = tmp_path / "copy.py"
    script.write_text(COPY_SAMPLE)
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    main(["run", "--task", str(task.root), str(script), "--instrument", "static",
          "--backend", backend])
    out = json.loads(capsys.readouterr().out)
    assert out["instrumentation"]["milestones_placed"] == ["libraries_imported"]
    assert out["reward"]["status"] == "no_model_training" and out["reward"]["reward"] == -10.0
    assert out["grade"]["valid"]  # the grader alone would have paid for the copy
