"""What the backend tests (ray, docker) compare against the local sandbox: the hostile program
classes, the record fields that must agree, and the telco-churn task they run on."""

import textwrap

from rl4mle_jax.env.execute import run_and_grade
from rl4mle_jax.env.tasks import prepare_task
from tests.env.test_execute import (
    CONSTANT,
    FORGERS,
    SECRET,
    _assert_no_host_content,
    _link_program,
)
from tests.env.test_reward_hacking import FAKE_NONCE, FIT_NOT_REACHED, PRINT_STRINGS

KEYS = ("status", "failure_reason", "reward", "milestones", "score", "submission_exists")

FIT = ("from sklearn.linear_model import LogisticRegression\n"
       "LogisticRegression().fit([[0], [1]], [0, 1])\n")
# over every task's cap: refused before any bytes are read
TOO_LARGE = FIT + ("import os\nf = open('submission/submission.csv', 'w'); f.write('id,churn\\n')\n"
                   "f.close(); os.truncate('submission/submission.csv', 70 << 20)\n")
FORK_BOMB = FIT + textwrap.dedent("""\
    import os, time
    n = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            n += 1
    except OSError as e:
        print("fork refused after", n, type(e).__name__, flush=True)
        raise SystemExit(3)
    """)
MEMORY_HOG = FIT + "x = bytearray(64 << 30)\n"
NETWORK = FIT + textwrap.dedent("""\
    import socket
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    open("submission/submission.csv", "w").write("id,churn\\n")
    """)

# Links to the answers and host files, forged milestones, no training, an oversized submission.
HOSTILE = ("answers", "test_answers", "passwd", "host_secret", "answers_dir", "forger",
           "fake_nonce", "print_strings", "constant", "fit_not_reached", "too_large")
# Resource and network classes, and a second forger.
HOSTILE_MORE = ("forger_listdir", "fork_bomb", "memory_hog", "network")


def task_for_tests(tmp_path_factory):
    return prepare_task("telco-churn", tmp_path_factory.mktemp("data"), reference="recorded")


def hostile_program(name: str, task, tmp_path) -> tuple[str, str]:
    """(code, split) of one hostile class; writes the host secret it links to into tmp_path."""
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    tmp_path.chmod(0o755)
    programs = {
        "answers": (lambda: _link_program(repr(str(task.answers_path("reward")))), "reward"),
        "test_answers": (lambda: _link_program(repr(str(task.answers_path("test")))), "test"),
        "passwd": (lambda: _link_program("'/etc/passwd'"), "reward"),
        "host_secret": (lambda: _link_program(repr(str(tmp_path / "secret.txt"))), "reward"),
        "answers_dir": (lambda: _link_program(repr(str(task.answers_path("reward").parent)),
                                              whole_dir=True), "reward"),
        "forger": (lambda: FORGERS[0], "reward"),
        "forger_listdir": (lambda: FORGERS[1], "reward"),
        "fake_nonce": (lambda: FAKE_NONCE, "reward"),
        "print_strings": (lambda: PRINT_STRINGS, "reward"),
        "constant": (lambda: CONSTANT, "reward"),
        "fit_not_reached": (lambda: FIT_NOT_REACHED, "reward"),
        "too_large": (lambda: TOO_LARGE, "reward"),
        "fork_bomb": (lambda: FORK_BOMB, "reward"),
        "memory_hog": (lambda: MEMORY_HOG, "reward"),
        "network": (lambda: NETWORK, "reward"),
    }
    make, split = programs[name]
    return make(), split


def record(run) -> dict:
    """The fields of a run's reward record that every backend must agree on."""
    rec = run.reward.to_dict()
    return {k: rec[k] for k in KEYS}


def assert_hostile_record_as_reference(name: str, task, tmp_path, sandbox, reference):
    """Runs hostile class `name` in `sandbox` and in `reference`: not valid, the same record,
    nothing of the host in it. Returns the sandbox's run for the backend's own checks."""
    code, split = hostile_program(name, task, tmp_path)
    run = run_and_grade(code, task, sandbox, split=split)
    want = run_and_grade(code, task, reference, split=split)
    assert run.reward.status != "valid", run.reward.to_json()
    assert record(run) == record(want), (run.exec["stderr"][-800:], want.exec["stderr"][-800:])
    _assert_no_host_content(run, task, split)
    return run
