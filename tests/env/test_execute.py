"""Hostile programs through the one run-and-grade step: the CLI, the loop's episode, evaluation.

Each program is a class of attack from the security issue (links to host files, grader denial
of service, crashes of host steps, forged milestones, valid reward without training); each test
asserts the named outcome, that no host file's content reaches a record, a report or a prompt,
and that the host's work stays bounded.
"""

import asyncio
import json
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from rl4mle_jax.env import prompts as prompts_lib
from rl4mle_jax.env.execute import RunRecord, run_and_grade
from rl4mle_jax.env.instrument_lm import Instrumenter
from rl4mle_jax.env.reward import RewardConfig
from rl4mle_jax.env.sandbox import Sandbox
from rl4mle_jax.env.tasks import prepare_task
from rl4mle_jax.rollout.buffer import SolutionBuffer
from rl4mle_jax.rollout.episode import EpisodeConfig, EpisodeRunner
from rl4mle_jax.rollout.service import Generation

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
CONSTANT = textwrap.dedent("""\
    import pandas as pd
    test = pd.read_csv("input/test.csv")
    pd.DataFrame({"id": test["id"], "churn": 0.5}).to_csv("submission/submission.csv",
                                                          index=False)
    """)
SECRET = "top-secret-host-line-7f3a"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return prepare_task("telco-churn", tmp_path_factory.mktemp("data"), reference="recorded")


@pytest.fixture(scope="module")
def host_secret(tmp_path_factory):
    """A host file a program must never get quoted back: a copy of the answers, and a secret."""
    d = tmp_path_factory.mktemp("host")
    (d / "secret.txt").write_text(SECRET + "\n")
    return d


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    sb = Sandbox(backend=backend, timeout_s=120, memory_mb=4096,
                 work_root=tmp_path_factory.mktemp("runs"))
    yield sb
    sb.close()


def _answers_lines(task, split):
    return task.answers_path(split).read_text().splitlines()[1:6]


def _assert_no_host_content(run: RunRecord, task, split, extra=()):
    text = json.dumps(run.to_dict(), default=str) + prompts_lib.format_outcome(run.reward)
    for line in [*_answers_lines(task, split), SECRET, "root:x:0:0", *extra]:
        assert line not in text, line
    return text


def _runs_left(sandbox) -> list[Path]:
    return [p for p in Path(sandbox.work_root).glob("run_*")]


# ---------------------------------------------------------------- 1. links to host files
def _link_program(target_expr: str, whole_dir: bool = False) -> str:
    if whole_dir:
        return textwrap.dedent(f"""\
            import os, shutil
            from sklearn.linear_model import LogisticRegression
            LogisticRegression().fit([[0], [1]], [0, 1])
            shutil.rmtree("submission")
            os.symlink({target_expr}, "submission")
            """)
    return textwrap.dedent(f"""\
        import os
        from sklearn.linear_model import LogisticRegression
        LogisticRegression().fit([[0], [1]], [0, 1])
        os.symlink({target_expr}, "submission/submission.csv")
        """)


@pytest.mark.parametrize("split", ["reward", "test"])
def test_symlink_to_the_answers_is_never_graded(task, sandbox, split):
    answers = str(task.answers_path(split))
    run = run_and_grade(_link_program(repr(answers)), task, sandbox, split=split)
    assert run.reward.status == "failure", run.reward.to_json()
    assert run.reward.failure_reason == "invalid_submission:not_regular_file"
    assert run.reward.reward <= -10 + 0.6 and run.score is None
    _assert_no_host_content(run, task, split)
    assert not _runs_left(sandbox)


def test_links_to_host_files_and_directories_quote_nothing(task, sandbox, host_secret):
    (host_secret / "submission.csv").write_text(task.answers_path("reward").read_text())
    for code in (_link_program(repr(str(host_secret / "secret.txt"))),
                 _link_program(repr("/etc/passwd")),
                 _link_program(repr(str(host_secret)), whole_dir=True),
                 _link_program(repr(str(task.answers_path("reward").parent)), whole_dir=True)):
        run = run_and_grade(code, task, sandbox)
        assert run.reward.status == "failure", run.reward.to_json()
        assert run.reward.failure_reason.startswith("invalid_submission:"), run.reward.to_json()
        _assert_no_host_content(run, task, "reward")
    assert not _runs_left(sandbox)


def test_cli_run_of_a_link_attack_prints_no_host_content(task, tmp_path, capsys):
    from rl4mle_jax.env.__main__ import main

    script = tmp_path / "link.py"
    script.write_text(_link_program(repr(str(task.answers_path("test")))))
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    rc = main(["run", "--task", str(task.root), str(script), "--split", "test",
               "--instrument", "static", "--backend", backend, "--timeout", "60"])
    out = capsys.readouterr().out
    assert rc == 1
    rec = json.loads(out)
    assert rec["grade"]["valid"] is False and rec["grade"]["reason"] == "not_regular_file"
    assert rec["reward"]["reward"] <= -9.4
    for line in _answers_lines(task, "test"):
        assert line not in out


# ---------------------------------------------------------------- 2. grader denial of service
@pytest.mark.parametrize("body, reason", [
    ("f = open('submission/submission.csv', 'w'); f.write('id,churn\\n'); f.close(); "
     "os.truncate('submission/submission.csv', 60 << 20)", "too_large"),
    ("open('submission/submission.csv', 'w').write('id,churn\\n' + '1,0.5\\n' * 1_500_000)",
     None),
    ("open('submission/submission.csv', 'w').write(','.join(f'c{i}' for i in range(100_000)) "
     "+ '\\n')", None),
])
def test_grading_hostile_files_is_bounded(task, sandbox, body, reason):
    code = ("import os\nfrom sklearn.linear_model import LogisticRegression\n"
            "LogisticRegression().fit([[0], [1]], [0, 1])\n" + body + "\n")
    run = run_and_grade(code, task, sandbox)
    assert run.reward.status == "failure" and run.grade is not None, run.reward.to_json()
    assert not run.grade.valid
    if reason:
        assert run.grade.reason == reason
    assert run.timings["grade_s"] < 2.0, run.timings
    assert len(run.grade.message) <= 1000
    assert len(prompts_lib.format_outcome(run.reward)) <= 1200


# ---------------------------------------------------------------- 3. crashes of host steps
def test_deep_nesting_and_deep_trees_score_minus_ten_and_leave_nothing(task, sandbox):
    deep_expr = "x = " + "(" * 150 + "1" + ")" * 150 + "\n" + "y = " + "-" * 50_000 + "1\n"
    deep_tree = textwrap.dedent("""\
        import os
        os.chdir("tmp")
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
        raise SystemExit(3)
        """)
    dup_header = ("import pandas as pd\nt = pd.read_csv('input/test.csv')\n"
                  "open('submission/submission.csv', 'w').write('id, id ,churn\\n' + "
                  "''.join(f'{i},{i},0.5\\n' for i in t['id']))\n")
    for code, reason in ((deep_expr, None), (deep_tree, "runtime_error"),
                         (dup_header, None)):
        t0 = time.monotonic()
        run = run_and_grade(code, task, sandbox)
        assert time.monotonic() - t0 < 60
        assert run.reward.status in ("failure", "no_model_training"), run.reward.to_json()
        assert run.reward.reward <= -9.4
        if reason:
            assert run.reward.failure_reason == reason
    assert not _runs_left(sandbox)


# ---------------------------------------------------------------- 5. forged milestones
FORGERS = [
    # Finds the nonce in its own source through names built at run time.
    textwrap.dedent("""\
        import builtins, re
        src = getattr(builtins, "op" + "en")("ma" + "in." + "py").read()
        nonce = re.search("MS ([0-9a-f]{32}) ", src).group(1)
        for m in ["data_loaded", "model_defined", "model_trained", "predictions_made",
                  "submission_written"]:
            print("@" + "@MS", nonce, m, flush=True)
        raise SystemExit(1)
        """),
    # Lists the working directory and reads every file it finds.
    textwrap.dedent("""\
        import os, re
        for f in os.listdir("."):
            if os.path.isfile(f):
                for n in set(re.findall("[0-9a-f]{32}", open(f, errors="replace").read())):
                    for m in ["data_loaded", "model_trained", "predictions_made"]:
                        print("@" + "@MS", n, m, flush=True)
        raise SystemExit(1)
        """),
    # Gets its own source through a traceback and importlib.
    textwrap.dedent("""\
        import importlib.util, re, traceback
        try:
            1 / 0
        except ZeroDivisionError as e:
            path = traceback.extract_tb(e.__traceback__)[0].filename
        spec = importlib.util.spec_from_file_location("me", path)
        src = spec.loader.get_source("me")
        for n in set(re.findall("[0-9a-f]{32}", src)):
            for m in ["data_loaded", "model_trained", "predictions_made"]:
                print("@" + "@MS", n, m, flush=True)
        raise SystemExit(1)
        """),
    # Functions that only carry the names of milestone events.
    textwrap.dedent("""\
        def read_csv(p): return None
        def train(x): return None
        def predict(x): return None
        class Model:
            def fit(self, x, y): return self
            def predict(self, x): return [0]
        data = read_csv("input/train.csv")
        m = Model().fit(data, data)
        train(data)
        m.predict(data)
        predict(data)
        raise SystemExit(1)
        """),
]


@pytest.mark.parametrize("code", FORGERS)
def test_forged_milestones_earn_nothing_beyond_the_real_ones(task, sandbox, code):
    run = run_and_grade(code, task, sandbox)
    rec = run.reward
    assert rec.status == "failure", rec.to_json()
    assert set(rec.milestones) <= set(rec.witnessed), rec.to_json()
    assert not {"data_loaded", "model_trained", "predictions_made"} & set(rec.milestones)
    assert rec.reward <= -10 + 0.1 * len(rec.witnessed) + 1e-9


# ---------------------------------------------------------------- 6. valid without training
UNTRAINED = [
    CONSTANT,
    CONSTANT + "if False:\n    from sklearn.linear_model import LogisticRegression\n"
               "    LogisticRegression().fit([[0]], [0])\n",
    CONSTANT + "msg = f\"{'model.fit(X, y)'}\"\n# model.fit(X, y) __file__ main.py\n",
    CONSTANT + "def train(m):\n    return m\ntrain(None)\nclass M:\n    def fit(self, x, y):\n"
               "        return self\nM().fit(1, 2)\n",
    CONSTANT + "import sys\nsys.stdout.write('x' * (2 << 20))\n",  # floods past the cap
    CONSTANT.replace("0.5", "(test['tenure'] < 12) * 0.6 + 0.2"),  # a hand-written rule
]


@pytest.mark.parametrize("code", UNTRAINED)
def test_no_real_training_never_gets_a_valid_reward(task, sandbox, code):
    run = run_and_grade(code, task, sandbox)
    assert run.grade is not None and run.grade.valid  # the grader alone would pay for it
    assert run.reward.status == "no_model_training", run.reward.to_json()
    assert run.reward.failure_reason in ("no_model_training", "model_training_not_reached")
    assert run.reward.reward == -10.0 and run.score is None


def test_honest_program_is_valid_with_witnessed_milestones(task, sandbox):
    run = run_and_grade(HONEST, task, sandbox, keep_submission=True)
    rec = run.reward
    assert rec.status == "valid", rec.to_json()
    assert rec.evidence_source == "witness" and "model_trained" in rec.witnessed
    assert rec.milestones == ["libraries_imported", "data_loaded", "model_defined",
                              "model_trained", "predictions_made", "submission_written"]
    assert run.submission.startswith(b"id,churn")
    assert not _runs_left(sandbox)


def test_the_papers_marker_rule_is_still_available_for_ablations(task, sandbox):
    run = run_and_grade(HONEST, task, sandbox, cfg=RewardConfig(milestone_evidence="markers"))
    assert run.reward.status == "valid" and run.reward.evidence_source == "markers"
    assert len(run.reward.milestones) == 6


# ---------------------------------------------------------------- the loop's episode
class _TextTokenizer:
    is_chat = False

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class _ScriptedPolicy:
    """The policy's generation service, answering with a fixed (hostile) response."""

    def __init__(self, response):
        self.response = response

    async def generate(self, prompt_ids):
        ids = [ord(c) for c in self.response]
        return Generation(prompt_ids, ids, [0.0] * len(ids), True, 0)


@pytest.mark.parametrize("code, status", [
    (_link_program("'/etc/passwd'"), "failure"),
    (CONSTANT, "no_model_training"),
    (FORGERS[0], "failure"),
    (HONEST, "valid"),
])
def test_loop_episode_scores_hostile_programs(task, sandbox, code, status):
    tok = _TextTokenizer()
    pcfg = prompts_lib.PromptConfig(max_prompt_tokens=8192, max_response_tokens=4096)
    ctx = prompts_lib.task_context(task, ["pandas", "scikit-learn"], cfg=pcfg)
    runner = EpisodeRunner(
        task=task, tokenizer=tok, policy=_ScriptedPolicy(f"Plan.\n```python\n{code}```"),
        sandbox=sandbox, instrumenter=Instrumenter("static"), buffer=SolutionBuffer(),
        context=ctx, cfg=EpisodeConfig(timeout_s=60), reward_cfg=RewardConfig(),
        prompt_cfg=pcfg)
    exp = asyncio.run(runner(runner.make_request(0)))
    assert exp.record["status"] == status, exp.record
    assert exp.duration_s > 0 and exp.timings["grade_s"] < 2
    log_line = json.dumps(exp.log_record(), default=str)
    assert "root:x:0:0" not in log_line
    if status != "valid":
        assert exp.reward <= -9.4
    assert not _runs_left(sandbox)


def test_loop_reuses_an_identical_programs_run(task, sandbox, monkeypatch):
    """run.reuse_runs: the same code twice runs once (same record and Δt); its reuses spent,
    it runs afresh; a hostile program reused keeps its failure."""
    tok = _TextTokenizer()
    pcfg = prompts_lib.PromptConfig(max_prompt_tokens=8192, max_response_tokens=4096)
    ctx = prompts_lib.task_context(task, ["pandas", "scikit-learn"], cfg=pcfg)
    runs = []
    real_arun = sandbox.arun

    async def counting_arun(*a, **kw):
        runs.append(1)
        return await real_arun(*a, **kw)
    monkeypatch.setattr(sandbox, "arun", counting_arun)

    async def episodes(code, n):
        runner = EpisodeRunner(
            task=task, tokenizer=tok, policy=_ScriptedPolicy(f"Plan.\n```python\n{code}```"),
            sandbox=sandbox, instrumenter=Instrumenter("static"), buffer=SolutionBuffer(),
            context=ctx, cfg=EpisodeConfig(timeout_s=60, reuse_runs=1),
            reward_cfg=RewardConfig(), prompt_cfg=pcfg)
        return [await runner(runner.make_request(i)) for i in range(n)]

    honest = asyncio.run(episodes(HONEST, 3))
    assert len(runs) == 2 and [e.reused_run for e in honest] == [False, True, False]
    assert honest[1].record == honest[0].record and honest[1].duration_s == honest[0].duration_s
    assert honest[0].record["status"] == "valid"
    assert honest[1].finished_at - honest[1].started_at >= 0.9 * honest[0].timings[
        "sandbox_wall_s"]  # the reuse waited out the original's time
    forged = asyncio.run(episodes(FORGERS[0], 2))
    assert [e.record["status"] for e in forged] == ["failure", "failure"]
    assert forged[1].reused_run and len(runs) == 3
    assert not _runs_left(sandbox)


@pytest.mark.parametrize("code", ["1+" * 100_000 + "1", "-" * 100_000 + "1",
                                  "x = " + "[" * 5000 + "]" * 5000])
def test_code_too_deep_to_compile_is_a_named_failure(code):
    from rl4mle_jax.env.actions import extract_action, extract_code_block

    t0 = time.monotonic()
    action = extract_action(f"Plan.\n```python\n{code}\n```")
    assert action.failure == "syntax_error" and action.message, action
    assert extract_code_block(code) is None
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("name", ["sparse", "forger", "constant", "deep_tree", "passwd"])
def test_cli_run_of_each_class_is_named_bounded_and_leaves_nothing(task, tmp_path, capsys,
                                                                   monkeypatch, name):
    """The real command line, one hostile program per class: named -10, no host content."""
    from rl4mle_jax.env.__main__ import main

    programs = {
        "sparse": ("import os\nfrom sklearn.linear_model import LogisticRegression\n"
                   "LogisticRegression().fit([[0], [1]], [0, 1])\n"
                   "open('submission/submission.csv', 'w').write('id,churn\\n')\n"
                   "os.truncate('submission/submission.csv', 60 << 20)\n"),
        "forger": FORGERS[0],
        "constant": CONSTANT,
        "deep_tree": ("import os\nos.chdir('tmp')\nfor _ in range(3000):\n    os.mkdir('d')\n"
                      "    os.chdir('d')\n"),
        "passwd": _link_program("'/etc/passwd'"),
    }
    script = tmp_path / f"{name}.py"
    script.write_text(programs[name])
    work_root = tmp_path / "runs"
    backend = "bwrap" if shutil.which("bwrap") else "subprocess"
    monkeypatch.setenv("RL4MLE_SANDBOX_ROOT", str(work_root))
    t0 = time.monotonic()
    rc = main(["run", "--task", str(task.root), str(script), "--instrument", "static",
               "--backend", backend, "--timeout", "60"])
    wall = time.monotonic() - t0
    out = capsys.readouterr().out
    rec = json.loads(out)
    assert rc == 1 and wall < 90
    assert rec["reward"]["reward"] <= -9.4 and rec["reward"]["failure_reason"], rec["reward"]
    assert rec["timings"]["grade_s"] < 2.0
    for line in [*_answers_lines(task, "reward"), "root:x:0:0"]:
        assert line not in out
    assert not list(work_root.glob("run_*"))
