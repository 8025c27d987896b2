"""The grader against hostile submissions: links, special files, huge and malformed CSVs.

Every case builds what a sandboxed program could leave in its run directory and asserts the
named reason, a bounded message that quotes nothing from outside the run (no line of the
task's answers, none of /etc/passwd), a time bound, and that nothing raises.

Hard links: inside the sandbox the run directory is its own mount (tmpfs) and
``fs.protected_hardlinks`` stops a program linking files it does not own, so a hard link to a
host file cannot be made there. Here (one filesystem, same user) it can, which lets us check
the second fence: a file with more than one name is refused without being quoted.
"""

import os
import socket
import stat
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rl4mle_jax.env import grading
from rl4mle_jax.env.grading import (
    MAX_MESSAGE_CHARS,
    QUOTE_CHARS,
    REASONS,
    GradeReport,
    TaskError,
    grade,
    grade_bytes,
    grade_run,
)
from rl4mle_jax.env.submission import (
    MAX_BYTES,
    MIN_BYTES,
    read_run_submission,
    submission_bounds,
    submission_byte_cap,
)
from tests.env.test_grading import CLASSES, make_task

SPLIT = "test"


@pytest.fixture
def task(tmp_path):
    return make_task(tmp_path / "toy-proba", metric="log_loss", targets=CLASSES,
                     label_column="animal")


@pytest.fixture
def run(tmp_path):
    """A run directory with an empty submission/ folder, as the sandbox leaves it."""
    (tmp_path / "run" / "submission").mkdir(parents=True)
    return tmp_path / "run"


def _secret_lines(task):
    lines = Path(task.answers_path(SPLIT)).read_text().splitlines()[1:]
    passwd = Path("/etc/passwd")
    if passwd.exists():
        lines += [ln for ln in passwd.read_text().splitlines() if len(ln) > 8]
    return lines


def _valid_csv(task, split=SPLIT) -> str:
    ans = pd.read_csv(task.answers_path(split))
    sub = ans.astype({c: float for c in CLASSES})
    sub[CLASSES] = sub[CLASSES] * 0.8 + 0.2 / 3
    return sub.to_csv(index=False)


def check(task, rep, reason, started, limit_s=5.0):
    """Named reason, bounded message quoting nothing from outside the run, bounded time."""
    assert time.monotonic() - started < limit_s
    assert isinstance(rep, GradeReport)
    assert (rep.valid, rep.reason) == (False, reason), rep
    assert rep.reason in REASONS and rep.score is None
    assert 0 < len(rep.message) <= MAX_MESSAGE_CHARS
    for line in _secret_lines(task):
        assert line not in rep.message, (line, rep.message)


def run_grade(task, run_dir, limit_s=5.0):
    """grade_run in a thread, so a grader that blocks fails the test instead of hanging it."""
    out = {}
    t = threading.Thread(target=lambda: out.update(rep=grade_run(task, run_dir, SPLIT)),
                         daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), "grade_run blocked"
    return out["rep"]


# ------------------------------------------------------------------ how the file is found


def test_valid_submission_through_run_dir(task, run):
    (run / "submission" / "submission.csv").write_text(_valid_csv(task))
    rep = grade_run(task, run, SPLIT)
    assert rep.valid and rep.score == pytest.approx(-np.log(0.8 + 0.2 / 3)), rep
    assert rep.submission_path == "submission/submission.csv"  # no host path in the report


def test_bom_and_crlf_are_fine(task, run):
    text = _valid_csv(task).replace("\n", "\r\n")
    (run / "submission" / "submission.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert grade_run(task, run, SPLIT).valid


@pytest.mark.parametrize("target", ["answers", "answers_relative", "passwd", "dev_zero"])
def test_symlinked_file_is_refused(task, run, target):
    dst = {"answers": str(task.answers_path(SPLIT)), "passwd": "/etc/passwd",
           "dev_zero": "/dev/zero",
           "answers_relative": os.path.relpath(task.answers_path(SPLIT), run / "submission")}
    os.symlink(dst[target], run / "submission" / "submission.csv")
    t0 = time.monotonic()
    rep = run_grade(task, run)
    check(task, rep, "not_regular_file", t0)
    assert "symbolic link" in rep.message and "passwd" not in rep.message
    assert "answers" not in rep.message and "private" not in rep.message


def test_symlinked_submission_dir_is_refused(task, run, tmp_path):
    """Linking submission/ itself to a host dir whose submission.csv is the answers."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "submission.csv").write_text(Path(task.answers_path(SPLIT)).read_text())
    (run / "submission").rmdir()
    os.symlink(host, run / "submission")
    t0 = time.monotonic()
    rep = run_grade(task, run)
    check(task, rep, "not_regular_file", t0)
    assert "submission/ is a symbolic link" in rep.message


def test_symlinked_run_dir_is_refused(task, run, tmp_path):
    (run / "submission" / "submission.csv").write_text(_valid_csv(task))
    os.symlink(run, tmp_path / "alias")
    rep = grade_run(task, tmp_path / "alias", SPLIT)
    assert (rep.valid, rep.reason) == (False, "no_file")


def test_hard_link_to_answers_is_refused(task, run):
    os.link(task.answers_path(SPLIT), run / "submission" / "submission.csv")
    t0 = time.monotonic()
    check(task, run_grade(task, run), "not_regular_file", t0)


def test_fifo_does_not_block(task, run):
    os.mkfifo(run / "submission" / "submission.csv")
    t0 = time.monotonic()
    rep = run_grade(task, run)
    check(task, rep, "not_regular_file", t0)
    assert "FIFO" in rep.message
    # The CLI path (a user's own file) must not block on a FIFO either.
    out = {}
    th = threading.Thread(target=lambda: out.update(
        rep=grade(task, run / "submission" / "submission.csv", SPLIT)), daemon=True)
    th.start()
    th.join(5)
    assert not th.is_alive() and out["rep"].reason == "not_regular_file"


def test_socket_and_directory_and_device(task, run, monkeypatch):
    sub = run / "submission"
    monkeypatch.chdir(sub)  # AF_UNIX paths are limited to 108 bytes; bind relative
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("submission.csv")
        t0 = time.monotonic()
        rep = run_grade(task, run)
        check(task, rep, "not_regular_file", t0)
        assert "socket" in rep.message
    finally:
        s.close()
    os.unlink(sub / "submission.csv")
    (sub / "submission.csv").mkdir()
    check(task, run_grade(task, run), "not_regular_file", time.monotonic())
    os.rmdir(sub / "submission.csv")
    try:
        os.mknod(sub / "submission.csv", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
    except OSError:
        return  # no CAP_MKNOD here (nor in the sandbox): nothing more to check
    rep = run_grade(task, run)
    check(task, rep, "not_regular_file", time.monotonic())
    assert "character device" in rep.message


def test_missing_and_misplaced(task, run):
    t0 = time.monotonic()
    check(task, grade_run(task, run, SPLIT), "no_file", t0)
    (run / "submission").rmdir()
    check(task, grade_run(task, run, SPLIT), "no_file", t0)
    (run / "submission").write_text(_valid_csv(task))  # a file where the directory should be
    check(task, grade_run(task, run, SPLIT), "not_regular_file", t0)
    check(task, grade_run(task, run / "nope", SPLIT), "no_file", t0)


def test_reader_never_raises_on_bad_paths(run):
    for rel in ("", "/etc/passwd", "../x", "submission/../../x", "submission/./submission.csv"):
        got = read_run_submission(run, 1 << 20, rel)
        assert got.data is None and got.reason == "no_file"


# ------------------------------------------------------------------ size and shape bounds


def test_byte_cap_from_expected_shape(task):
    b = submission_bounds(task, SPLIT)
    assert MIN_BYTES <= submission_byte_cap(task, SPLIT) == b.max_bytes <= MAX_BYTES
    assert b.expected_rows == 12 and b.max_rows > 12 and b.max_columns >= 4
    assert len(_valid_csv(task)) < b.max_bytes


@pytest.mark.parametrize("size", ["cap", "1GiB"])
def test_sparse_file(task, run, size):
    p = run / "submission" / "submission.csv"
    p.write_text("id,cat,dog,owl\n")
    cap = submission_byte_cap(task, SPLIT)
    os.truncate(p, cap if size == "cap" else 1 << 30)
    t0 = time.monotonic()
    rep = run_grade(task, run)
    check(task, rep, "unreadable_csv" if size == "cap" else "too_large", t0)
    if size == "cap":
        assert "NUL" in rep.message
    assert grade(task, p, SPLIT).reason == rep.reason  # the CLI path too


def _write(run, data):
    p = run / "submission" / "submission.csv"
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def test_too_many_rows(task, run):
    b = submission_bounds(task, SPLIT)
    rows = "".join(f"{100 + i},0.2,0.3,0.5\n" for i in range(b.max_rows + 1))
    _write(run, "id,cat,dog,owl\n" + rows)
    t0 = time.monotonic()
    check(task, run_grade(task, run), "too_many_rows", t0)
    _write(run, "id,cat,dog,owl\n" + "1\n" * 1_500_000)  # 1.5 M short rows: over the cap
    check(task, run_grade(task, run), "too_large", t0)


def test_too_many_columns(task, run):
    b = submission_bounds(task, SPLIT)
    t0 = time.monotonic()
    _write(run, ",".join(f"c{i}" for i in range(b.max_columns + 1)) + "\n")
    check(task, run_grade(task, run), "too_many_columns", t0)
    header = ",".join(f"c{i}" for i in range(100_000))
    _write(run, header + "\n")
    rep = run_grade(task, run)
    check(task, rep, "too_many_columns", t0)
    assert "c99999" not in rep.message
    # Many short fields in one record spread over quoted newlines: refused before building.
    _write(run, "id,cat,dog,owl\n" + '"\n",' * 200_000 + "\n")
    check(task, run_grade(task, run), "too_many_columns", t0)


def test_long_cells(task, run):
    b = submission_bounds(task, SPLIT)
    t0 = time.monotonic()
    _write(run, "id,cat,dog,owl\n100," + "9" * (b.max_cell_chars + 1) + ",0.3,0.5\n")
    check(task, run_grade(task, run), "cell_too_long", t0)
    _write(run, "id,cat,dog,owl\n" + "x" * (b.max_bytes - 100))  # one line up to the cap
    check(task, run_grade(task, run), "cell_too_long", t0)
    _write(run, "id,cat,dog,owl\n" + '"' * (b.max_bytes - 100))  # deep quoting
    check(task, run_grade(task, run), "cell_too_long", t0)
    _write(run, "id,cat,dog,owl\n" + "x" * (60 << 20))  # one 60 MiB line
    check(task, run_grade(task, run), "too_large", t0)


def test_encoding_and_structure(task, run):
    t0 = time.monotonic()
    _write(run, b"id,cat,dog,owl\n100,0.2,0.3,\xff\xfe\n")
    check(task, run_grade(task, run), "invalid_utf8", t0)
    _write(run, "id,cat,dog,owl\n100,0.2,0.3\n")
    check(task, run_grade(task, run), "ragged_rows", t0)
    _write(run, 'id,cat,dog,owl\n100,"0.2,0.3,0.5\n')
    check(task, run_grade(task, run), "unreadable_csv", t0)
    _write(run, b"id,cat,dog,owl\n10\x000,0.2,0.3,0.5\n")  # "\x00" in an id
    check(task, run_grade(task, run), "unreadable_csv", t0)
    _write(run, "\n\n")
    check(task, run_grade(task, run), "unreadable_csv", t0)


def test_duplicate_id_column_after_stripping(task, run):
    """Used to raise a pandas error out of grade()."""
    text = _valid_csv(task)
    lines = text.splitlines()
    lines = ["id, id ,cat,dog,owl"] + [ln.split(",")[0] + "," + ln for ln in lines[1:]]
    _write(run, "\n".join(lines) + "\n")
    t0 = time.monotonic()
    rep = run_grade(task, run)
    check(task, rep, "duplicate_columns", t0)
    assert "'id'" in rep.message


def test_messages_quote_bounded_values(task, run):
    ans = pd.read_csv(task.answers_path(SPLIT))
    long = "h" * 200  # under the cell cap, over the quote cap
    rows = "".join(f"{i},{long}{k},0.3,0.5\n" for k, i in enumerate(ans["id"]))
    _write(run, "id,cat,dog,owl\n" + rows)
    rep = run_grade(task, run)
    check(task, rep, "non_numeric_values", time.monotonic())
    assert long not in rep.message and "h" * QUOTE_CHARS not in rep.message
    extra = ",".join(f"{'z' * 200}{i}" for i in range(3))
    _write(run, f"id,cat,dog,owl,{extra}\n")
    rep = run_grade(task, run)
    check(task, rep, "extra_columns", time.monotonic())
    assert "z" * 200 not in rep.message


# ------------------------------------------------------------------ totality


def test_unexpected_exception_is_grader_error(task, run, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("/etc/passwd secret")

    monkeypatch.setattr(grading, "_align", boom)
    _write(run, _valid_csv(task))
    rep = grade_run(task, run, SPLIT)
    check(task, rep, "grader_error", time.monotonic())
    assert "RuntimeError" in rep.message and "secret" not in rep.message


def test_broken_task_still_raises(task, run):
    _write(run, _valid_csv(task))
    ans_p = Path(task.answers_path(SPLIT))
    pd.read_csv(ans_p).drop(columns=["owl"]).to_csv(ans_p, index=False)
    with pytest.raises(TaskError, match="lacks columns"):
        grade_run(task, run, SPLIT)


def test_fuzz_never_raises(task):
    """Random mutations of a valid submission: always a report, a known reason, bounded."""
    rng = np.random.default_rng(0)
    base = _valid_csv(task).encode()
    alphabet = np.frombuffer(b'",\n\r 0.-e1nNaIf"' * 8 + b"\x00\xff\xef\xbb\xbf",
                             dtype=np.uint8)
    t0 = time.monotonic()
    for _ in range(300):
        buf = bytearray(base)
        for _ in range(int(rng.integers(1, 8))):
            op, at = rng.integers(0, 3), int(rng.integers(0, len(buf) + 1))
            chunk = bytes(rng.choice(alphabet, int(rng.integers(1, 6))))
            if op == 0:
                buf[at:at] = chunk
            elif op == 1:
                del buf[at:at + len(chunk)]
            else:
                buf[at:at + len(chunk)] = chunk
        rep = grade_bytes(task, bytes(buf), SPLIT)
        assert rep.valid or rep.reason in REASONS, rep
        assert len(rep.message) <= MAX_MESSAGE_CHARS
    assert time.monotonic() - t0 < 20
