"""The submission as hostile input: read it off disk without trusting it, bound it, parse it.

The submission file is written by the agent's program, so everything about it is hostile:
it may be a symbolic link (to the task's private answers, to ``/etc/passwd``), sit under a
linked ``submission/`` directory, be a FIFO that blocks a reader forever, a device, or a
sparse file of many GiB. ``read_run_submission`` opens each path component relative to the
run directory with ``O_NOFOLLOW`` (so no link anywhere on the path is followed), accepts only
a regular file with one link whose size is under the cap, and never raises. Its messages name
the path inside the run directory and the kind of entry found there, never anything read
through a link (no ``readlink``, no following).

Hard links: a hard link to a host file would be a regular file, so the sandbox must make them
impossible (the run directory is a separate mount, and ``fs.protected_hardlinks`` forbids
linking files the program does not own). As a second fence a file with more than one link is
refused here too.

``parse_submission`` then checks bytes, rows, columns and cell length against
``submission_bounds`` (from the task's expected shape) while it parses, with the stdlib csv
module fed one bounded physical line at a time, so no hostile file costs more than a small
multiple of its capped size in host memory, or more than linear time.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: the grader does not import the task loader
    from rl4mle_jax.env.tasks import Task

# Named failure reasons (the `reason` field of an invalid GradeReport).
REASONS = (
    "no_file", "unreadable_csv", "missing_columns", "extra_columns", "wrong_row_count",
    "missing_ids", "extra_ids", "duplicate_ids", "nan_values", "inf_values",
    "non_numeric_values", "prob_out_of_range", "prob_rows_not_normalised",
    "negative_values", "non_integer_values", "metric_error",
    # The submission as hostile input: how it was found on disk, then bounds and encoding.
    "not_regular_file", "too_large", "invalid_utf8", "too_many_rows", "too_many_columns",
    "cell_too_long", "ragged_rows", "duplicate_columns", "grader_error",
)
MAX_MESSAGE_CHARS = 500
QUOTE_CHARS = 60

RUN_SUBMISSION = "submission/submission.csv"
# Bounds on what a submission may be, from the task's expected shape (see submission_bounds).
COLUMN_MARGIN = 4
MIN_CELL_CHARS = 256
MAX_CELL_CHARS = 128 * 1024  # the csv module's default field limit; never raised globally
MIN_BYTES = 1 << 20
MAX_BYTES = 64 << 20
_READ_CHUNK = 1 << 20


class SubmissionError(Exception):
    """Invalid submission, with a named reason."""

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason, self.message = reason, message


def row_margin(n_rows: int) -> int:
    """Rows allowed beyond the expected count (room for a few extra/duplicate ids)."""
    return 16 + n_rows // 100


@dataclass(frozen=True)
class SubmissionRead:
    """Bytes of a run's submission, or why there are none (`reason` is one of REASONS)."""

    data: bytes | None
    reason: str | None
    message: str


@dataclass(frozen=True)
class SubmissionBounds:
    """Limits a submission of one task/split must fit before it is parsed."""

    max_bytes: int
    expected_rows: int  # rows of the answers
    max_rows: int  # data rows, header excluded
    max_columns: int
    max_cell_chars: int
    max_record_chars: int  # one CSV record, all its physical lines together


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _entry_kind(name: str, dir_fd: int) -> str:
    """What `name` is in `dir_fd`, from lstat only (describes the entry, never its target)."""
    try:
        return _kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a regular file"


def _fail(reason: str, message: str) -> SubmissionRead:
    return SubmissionRead(data=None, reason=reason, message=message[:300])


def _open_error(e: OSError, shown: str, name: str, dir_fd: int) -> SubmissionRead:
    if e.errno == errno.ENOENT:
        return _fail("no_file", f"no submission file at {shown}")
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):
        return _fail("not_regular_file", f"{shown} is {_entry_kind(name, dir_fd)}; the "
                     "submission must be a regular file inside the run directory (no links)")
    return _fail("no_file", f"cannot open {shown} ({errno.errorcode.get(e.errno, 'error')})")


def _read_capped(fd: int, max_bytes: int) -> bytes:
    """At most max_bytes + 1 bytes (one more than allowed tells "over the cap").

    One large read first: a regular file returns everything at once, with no chunk list and
    no joined copy (peak memory = the file's size, not twice it)."""
    data = os.read(fd, max_bytes + 1)
    if not data or len(data) > max_bytes:
        return data
    chunks = [data]
    left = max_bytes + 1 - len(data)
    while left > 0:
        b = os.read(fd, min(left, _READ_CHUNK))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def submission_present(workdir: Path) -> bool:
    """Anything at the run's submission path (a file, a link, ...), or submission/ is a link."""
    wd = Path(workdir)
    return os.path.lexists(wd / RUN_SUBMISSION) or os.path.islink(wd / "submission")


def read_run_submission(workdir: Path, max_bytes: int, rel: str = RUN_SUBMISSION
                        ) -> SubmissionRead:
    """Read `workdir/rel` without following any link, refusing anything but a small regular
    file; never raises, never blocks."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        return _fail("no_file", "bad submission path (must be relative, inside the run dir)")
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                               | os.O_CLOEXEC))
        except OSError:
            return _fail("no_file", "the run directory is missing or not a directory")
        for i, name in enumerate(parts[:-1]):
            shown = "/".join(parts[:i + 1]) + "/"
            try:
                fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                   | os.O_CLOEXEC, dir_fd=fds[-1]))
            except OSError as e:
                return _open_error(e, shown, name, fds[-1])
        name, dir_fd = parts[-1], fds[-1]
        try:  # lstat first: FIFOs and devices are refused without ever being opened
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            return _open_error(e, rel, name, dir_fd)
        if not stat.S_ISREG(st.st_mode):
            return _fail("not_regular_file", f"{rel} is {_kind(st.st_mode)}; the submission "
                         "must be a regular file inside the run directory (no links)")
        try:
            fds.append(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                               | os.O_CLOEXEC, dir_fd=dir_fd))
        except OSError as e:
            return _open_error(e, rel, name, dir_fd)
        fst = os.fstat(fds[-1])
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            return _fail("not_regular_file", f"{rel} changed while being opened")
        if fst.st_nlink != 1:
            return _fail("not_regular_file", f"{rel} is a hard link ({fst.st_nlink} names); "
                         "write the submission as a new file")
        if fst.st_size > max_bytes:
            return _fail("too_large", f"{rel} is {fst.st_size} bytes; the limit for this task "
                         f"is {max_bytes} bytes")
        data = _read_capped(fds[-1], max_bytes)
        if len(data) > max_bytes:  # grew after fstat
            return _fail("too_large", f"{rel} is over the limit of {max_bytes} bytes")
        return SubmissionRead(data=data, reason=None, message="")
    except Exception as e:  # noqa: BLE001 - total: any failure is a named reason
        return _fail("no_file", f"cannot read {rel} ({type(e).__name__})")
    finally:
        for fd in fds:
            os.close(fd)


def read_host_file(path: Path, max_bytes: int) -> SubmissionRead:
    """Read a user's own file (CLI `grade --submission`): links followed, but only a regular
    file under the cap, opened non-blocking so a FIFO never hangs."""
    shown = Path(path).name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return _fail("no_file", f"no submission file at {path}")
    except OSError as e:
        return _fail("no_file", f"cannot open {shown} ({errno.errorcode.get(e.errno, 'error')})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _fail("not_regular_file", f"{shown} is {_kind(st.st_mode)}")
        if st.st_size > max_bytes:
            return _fail("too_large", f"{shown} is {st.st_size} bytes; the limit for this task "
                         f"is {max_bytes} bytes")
        data = _read_capped(fd, max_bytes)
        if len(data) > max_bytes:
            return _fail("too_large", f"{shown} is over the limit of {max_bytes} bytes")
        return SubmissionRead(data=data, reason=None, message="")
    except OSError as e:
        return _fail("no_file", f"cannot read {shown} ({type(e).__name__})")
    finally:
        os.close(fd)


# ---------------------------------------------------------------- bounds from the answers

_FACTS_CACHE: dict[tuple[Any, ...], tuple[int, int, int]] = {}


def _mtime(path: Path | None) -> int | None:
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except OSError:
        return None


def _answers_facts(answers: Path, sample: Path | None) -> tuple[int, int, int]:
    """(data rows, columns, longest cell) of the trusted answers file (and sample header)."""
    key = (str(answers), _mtime(answers), str(sample), _mtime(sample))
    if key not in _FACTS_CACHE:
        if len(_FACTS_CACHE) > 64:
            _FACTS_CACHE.clear()
        n_rows, n_cols, longest = -1, 0, 0
        with open(answers, newline="", encoding="utf-8-sig") as f:
            for row in csv.reader(f):
                if row:
                    n_rows += 1
                    n_cols = max(n_cols, len(row))
                    longest = max(longest, max(map(len, row)))
        if sample is not None and _mtime(sample) is not None:
            with open(sample, newline="", encoding="utf-8-sig") as f:
                header = next(csv.reader(f), [])
            n_cols = max(n_cols, len(header))
        _FACTS_CACHE[key] = (max(n_rows, 0), n_cols, longest)
    return _FACTS_CACHE[key]


def submission_bounds(task: Task, split: str) -> SubmissionBounds:
    """Bytes, rows, columns and cell length allowed for a submission of `task` on `split`."""
    n_rows, n_cols, longest = _answers_facts(task.answers_path(split),
                                             task.sample_submission_path(split))
    max_rows = n_rows + row_margin(n_rows)
    max_cols = max(n_cols, 1 + len(task.target_columns)) + COLUMN_MARGIN
    cell = min(MAX_CELL_CHARS, max(MIN_CELL_CHARS, 4 * longest))
    record = max_cols * (cell + 3)  # quotes and separator per cell
    total = min(MAX_BYTES, max(MIN_BYTES, (max_rows + 1) * max_cols * (cell + 1)))
    return SubmissionBounds(max_bytes=total, expected_rows=n_rows, max_rows=max_rows,
                            max_columns=max_cols, max_cell_chars=cell, max_record_chars=record)


def submission_byte_cap(task: Task, split: str) -> int:
    """Bytes allowed for a submission of this task (from its expected shape, 1-64 MiB)."""
    return submission_bounds(task, split).max_bytes


# ---------------------------------------------------------------- bounded parse


def quote(value: Any) -> str:
    """repr of one value, cut to QUOTE_CHARS (messages reach the agent's prompt and logs)."""
    r = repr(value)
    return r if len(r) <= QUOTE_CHARS else r[:QUOTE_CHARS - 3] + "..."


def quote_list(values: Any, k: int = 5) -> str:
    values = list(values)
    more = f" (+{len(values) - k} more)" if len(values) > k else ""
    return ", ".join(quote(v) for v in values[:k]) + more


def quote_columns(columns: Any, k: int = 8) -> str:
    return "[" + quote_list(columns, k) + "]"


class _Counter:
    """Characters of the CSV record being read (reset by the caller after each record)."""

    def __init__(self) -> None:
        self.chars = 0
        self.lines: list[str] = []

    def reset(self) -> None:
        self.chars, self.lines = 0, []


def _lines(text: io.TextIOBase, b: SubmissionBounds, count: _Counter) -> Iterator[str]:
    """Physical lines, refusing one record longer than the bounds allow before the csv module
    ever builds it (a record of millions of short fields would cost GBs)."""
    while True:
        line = text.readline(b.max_record_chars + 1)
        if not line:
            return
        count.chars += len(line)
        count.lines.append(line)
        if count.chars > b.max_record_chars:
            if sum(ln.count(",") for ln in count.lines) >= b.max_columns:
                raise SubmissionError("too_many_columns", f"a row has more than "
                                      f"{b.max_columns} columns")
            raise SubmissionError("cell_too_long", f"a row is over {b.max_record_chars} "
                                  f"characters: a cell is longer than {b.max_cell_chars}")
        yield line


def _check_columns(header: list[str], expected: list[str]) -> None:
    missing_cols = [c for c in expected if c not in header]
    if missing_cols:
        raise SubmissionError("missing_columns", f"missing columns {quote_columns(missing_cols)}; "
                              f"expected {quote_columns(expected)}, got {quote_columns(header)}")
    extra_cols = [c for c in header if c not in expected]
    if extra_cols:
        raise SubmissionError("extra_columns", f"unexpected columns {quote_columns(extra_cols)}; "
                              f"expected {quote_columns(expected)}")


def parse_submission(data: bytes, b: SubmissionBounds, expected: list[str] | None = None
                     ) -> tuple[list[str], list[list[str]]]:
    """(stripped header, rows of str cells) of a CSV, stopping at the first bound broken.

    expected: column names; when given, the header is checked before any row is read.
    """
    if not data or data.isspace():
        raise SubmissionError("unreadable_csv", "the submission is empty")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise SubmissionError("unreadable_csv", f"not a text CSV: NUL byte at offset {nul}")
    count = _Counter()
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", errors="strict",
                            newline="")
    reader = csv.reader(_lines(text, b, count), strict=True)
    header: list[str] | None = None
    rows: list[list[str]] = []
    try:
        for rec in reader:
            count.reset()
            if not rec:  # blank line (pandas skips them too)
                continue
            if len(rec) > b.max_columns:
                raise SubmissionError("too_many_columns", f"line {reader.line_num} has "
                                      f"{len(rec)} columns; at most {b.max_columns} expected")
            if max(map(len, rec)) > b.max_cell_chars:
                raise SubmissionError("cell_too_long", f"line {reader.line_num} has a cell "
                                      f"longer than {b.max_cell_chars} characters")
            if header is None:
                header = [c.strip() for c in rec]
                dup = sorted({c for c in header if header.count(c) > 1})
                if dup:
                    raise SubmissionError("duplicate_columns", f"columns appear more than "
                                          f"once (after stripping spaces): {quote_columns(dup)}")
                if expected is not None:
                    _check_columns(header, expected)
                continue
            if len(rows) >= b.max_rows:
                raise SubmissionError("too_many_rows", f"more than {b.max_rows} rows; the "
                                      f"test set has {b.expected_rows}")
            if len(rec) != len(header):
                raise SubmissionError("ragged_rows", f"line {reader.line_num} has {len(rec)} "
                                      f"fields, the header has {len(header)}")
            rows.append(rec)
    except UnicodeDecodeError:
        raise SubmissionError("invalid_utf8", f"not valid UTF-8 text (near line "
                              f"{reader.line_num + 1})") from None
    except csv.Error as e:
        if "field larger" in str(e):
            raise SubmissionError("cell_too_long", f"a cell is longer than "
                                  f"{b.max_cell_chars} characters") from None
        raise SubmissionError("unreadable_csv", f"cannot parse as CSV near line "
                              f"{reader.line_num}: {str(e)[:120]}") from None
    if header is None:
        raise SubmissionError("unreadable_csv", "the submission has no header line")
    return header, rows
