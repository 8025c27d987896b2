"""Grade a submission CSV against a task's answers; every failure has a named reason.

CSVs are read with every cell as text (no dtype inference, so pandas' object/string dtype
choice cannot matter) and numbers are parsed with Python's ``float``, which round-trips
exactly like ``pd.read_csv(float_precision="round_trip")``. Rows are aligned by id, never by
row order.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl4mle_jax.env.metrics import Metric, get_metric
from rl4mle_jax.env.submission import (
    RUN_SUBMISSION,
    SubmissionBounds,
    read_host_file,
    read_run_submission,
    submission_bounds,
    submission_byte_cap,
)
from rl4mle_jax.env.tasks import Task

# Named failure reasons (the `reason` field of an invalid report).
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
# Probability rows may be off by formatting (e.g. 4 decimals over 32 classes); larger
# deviations are an error, smaller ones are renormalised away as Kaggle does.
ROW_SUM_ATOL = 1e-3
_NAN_TEXT = {"", "nan", "na", "n/a", "null", "none", "<na>"}


@dataclass
class GradeReport:
    """Outcome of grading one submission."""

    task_id: str
    split: str
    metric: str
    direction: str
    valid: bool
    score: float | None = None
    reason: str | None = None
    message: str = ""
    reference_scores: dict = field(default_factory=dict)
    n_rows: int | None = None
    submission_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)


class TaskError(ValueError):
    """The task itself is broken (answers lack columns): the host's fault, so it raises."""


class SubmissionError(Exception):
    """Invalid submission, with a named reason."""

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason, self.message = reason, message


def read_csv_text(path: Path) -> pd.DataFrame:
    """Read a trusted CSV (the host's answers) with all cells as Python str ("" when empty)."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    df.columns = [str(c).strip() for c in df.columns]
    return df.astype(object)


def _q(value: Any) -> str:
    """repr of one value, cut to QUOTE_CHARS (messages reach the agent's prompt and logs)."""
    r = repr(value)
    return r if len(r) <= QUOTE_CHARS else r[:QUOTE_CHARS - 3] + "..."


def _examples(values: Any, k: int = 5) -> str:
    values = list(values)
    more = f" (+{len(values) - k} more)" if len(values) > k else ""
    return ", ".join(_q(v) for v in values[:k]) + more


def _cols(columns: Any, k: int = 8) -> str:
    return "[" + _examples(columns, k) + "]"


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
        raise SubmissionError("missing_columns", f"missing columns {_cols(missing_cols)}; "
                              f"expected {_cols(expected)}, got {_cols(header)}")
    extra_cols = [c for c in header if c not in expected]
    if extra_cols:
        raise SubmissionError("extra_columns", f"unexpected columns {_cols(extra_cols)}; "
                              f"expected {_cols(expected)}")


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
                                          f"once (after stripping spaces): {_cols(dup)}")
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


def _keys(ids: list[str]) -> list[tuple[str, int]]:
    """Alignment keys: (stripped id, occurrence number); tuples, so no id can collide."""
    seen: dict[str, int] = {}
    out = []
    for s in ids:
        s = str(s).strip()
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.append((s, k))
    return out


def _parse_floats(values: np.ndarray, column: str) -> np.ndarray:
    try:  # fast path: every cell is a plain number (Python float parsing, exact round trip)
        return np.asarray(values, dtype=object).astype(float)
    except (ValueError, TypeError):
        pass
    out = np.empty(len(values), dtype=float)
    bad = []
    for i, s in enumerate(values):
        t = str(s).strip()
        if t.lower() in _NAN_TEXT:
            out[i] = np.nan
            continue
        low = t.lower()
        if low in ("true", "false"):
            out[i] = 1.0 if low == "true" else 0.0
            continue
        try:
            out[i] = float(t)
        except ValueError:
            bad.append(t)
    if bad:
        raise SubmissionError("non_numeric_values",
                              f"column {_q(column)} has non-numeric values: {_examples(bad)}")
    return out


def _numeric_block(df: pd.DataFrame, columns: list[str], ids: list[str]) -> np.ndarray:
    """[N, K] floats; raises on non-numeric, NaN and infinite cells (naming the column)."""
    cols = [_parse_floats(df[c].to_numpy(), c) for c in columns]
    arr = np.stack(cols, axis=1)
    for k, c in enumerate(columns):
        nan = np.isnan(arr[:, k])
        if nan.any():
            raise SubmissionError("nan_values", f"column {_q(c)} has {int(nan.sum())} missing/NaN "
                                  f"values (ids {_examples(np.asarray(ids)[nan])})")
        inf = np.isinf(arr[:, k])
        if inf.any():
            raise SubmissionError("inf_values", f"column {_q(c)} has {int(inf.sum())} infinite "
                                  f"values (ids {_examples(np.asarray(ids)[inf])})")
    return arr


def _check_values(metric: Metric, arr: np.ndarray, columns: list[str]) -> None:
    if metric.kind in ("probability", "distribution"):
        out = (arr < 0) | (arr > 1)
        if out.any():
            k = int(np.argmax(out.any(axis=0)))
            raise SubmissionError("prob_out_of_range", f"{int(out.sum())} probabilities outside "
                                  f"[0, 1] (first in column {_q(columns[k])})")
    if metric.kind == "distribution":
        sums = arr.sum(axis=1)
        off = np.abs(sums - 1.0) > ROW_SUM_ATOL
        if off.any():
            raise SubmissionError("prob_rows_not_normalised", f"{int(off.sum())} rows of "
                                  f"probabilities over {_cols(columns)} do not sum to 1 (e.g. "
                                  f"{sums[off][0]:.6g}; tolerance {ROW_SUM_ATOL})")
    if metric.kind == "nonnegative" and (arr < 0).any():
        raise SubmissionError("negative_values", f"{int((arr < 0).sum())} negative predictions; "
                              f"{metric.name} needs values >= 0")
    if metric.kind == "integer" and (np.abs(arr - np.round(arr)) > 1e-9).any():
        raise SubmissionError("non_integer_values", f"{metric.name} needs integer ratings")


def _labels(series: pd.Series, numeric: bool, column: str, ids: list[str]) -> np.ndarray:
    vals = series.map(lambda s: str(s).strip()).to_numpy()
    empty = np.array([v.lower() in _NAN_TEXT for v in vals])
    if empty.any():
        raise SubmissionError("nan_values", f"column {_q(column)} has {int(empty.sum())} empty "
                              f"labels (ids {_examples(np.asarray(ids)[empty])})")
    if numeric:
        return _parse_floats(vals, column)
    return vals.astype(str)


def _expected_columns(task: Task, split: str) -> list[str]:
    sample = task.sample_submission_path(split)
    if sample is not None and sample.exists():
        cols = list(pd.read_csv(sample, nrows=0).columns)
        cols = [str(c).strip() for c in cols]
        if task.id_column in cols and all(t in cols for t in task.target_columns):
            return cols
    return [task.id_column, *task.target_columns]


_ANSWERS_CACHE: dict[tuple[str, float], pd.DataFrame] = {}


def _read_answers(path: Path) -> pd.DataFrame:
    key = (str(path), path.stat().st_mtime)
    if key not in _ANSWERS_CACHE:
        if len(_ANSWERS_CACHE) > 64:
            _ANSWERS_CACHE.clear()
        _ANSWERS_CACHE[key] = read_csv_text(path)
    return _ANSWERS_CACHE[key]


def _align(task: Task, sub: pd.DataFrame, ans: pd.DataFrame) -> np.ndarray:
    """Index into `sub` for each answers row; raises on id problems.

    Examples quote the submission's ids and the test ids, which the agent has (test.csv).
    """
    idc = task.id_column
    ans_keys, sub_keys = _keys(ans[idc].tolist()), _keys(sub[idc].tolist())
    ans_unique = all(k == 0 for _, k in ans_keys)
    ans_set, sub_set = set(ans_keys), set(sub_keys)
    missing = [i for i, k in ans_keys if (i, k) not in sub_set]
    extra = [i for i, k in sub_keys if (i, k) not in ans_set]
    dup = sorted({i for i, k in sub_keys if k > 0}) if ans_unique else []
    n_sub, n_ans = len(sub), len(ans)
    if dup:
        raise SubmissionError("duplicate_ids", f"ids appear more than once: {_examples(dup)}"
                              + (f"; {len(missing)} test ids missing" if missing else ""))
    if n_sub == n_ans and missing:
        raise SubmissionError("missing_ids", f"{len(missing)} ids of the test set are missing "
                              f"(e.g. {_examples(missing)}); {len(extra)} rows have ids that are "
                              f"not in the test set (e.g. {_examples(extra)})")
    if n_sub < n_ans and missing and not extra:
        raise SubmissionError("missing_ids", f"{len(missing)} ids of the test set are missing "
                              f"(e.g. {_examples(missing)}); expected {n_ans} rows, got {n_sub}")
    if n_sub > n_ans and extra and not missing:
        raise SubmissionError("extra_ids", f"{len(extra)} ids are not in the test set "
                              f"(e.g. {_examples(extra)}); expected {n_ans} rows, got {n_sub}")
    if n_sub != n_ans or missing or extra:
        raise SubmissionError("wrong_row_count", f"expected {n_ans} rows (one per test id), got "
                              f"{n_sub}; {len(missing)} test ids missing, {len(extra)} unknown")
    pos = {k: i for i, k in enumerate(sub_keys)}
    return np.array([pos[k] for k in ans_keys], dtype=np.int64)


def _answers(task: Task, split: str) -> pd.DataFrame:
    """The split's answers; a broken task raises TaskError (the host's fault, not the run's)."""
    ans = _read_answers(task.answers_path(split))
    lacking = [c for c in [task.id_column, *task.target_columns] if c not in ans.columns]
    if lacking:
        raise TaskError(f"answers file {task.answers_path(split)} lacks columns {lacking}")
    metric = get_metric(task.metric)
    if not metric.multi_column and len(task.target_columns) != 1:
        raise TaskError(f"metric {metric.name} scores one column, task has "
                        f"{task.target_columns}")
    return ans


def _score(task: Task, split: str, data: bytes, ans: pd.DataFrame) -> tuple[float, int]:
    metric = get_metric(task.metric)
    expected = _expected_columns(task, split)
    header, rows = parse_submission(data, submission_bounds(task, split), expected)
    sub = pd.DataFrame(rows, columns=header, dtype=object) if rows else \
        pd.DataFrame({c: pd.Series([], dtype=object) for c in header})
    idx = _align(task, sub, ans)
    sub = sub.iloc[idx].reset_index(drop=True)
    ids = ans[task.id_column].tolist()
    cols = list(task.target_columns)
    if metric.kind == "text":
        y_true = ans[cols[0]].to_numpy().astype(str)
        y_pred = sub[cols[0]].map(lambda s: "" if str(s).lower() in ("nan",) else str(s))
        y_pred = y_pred.to_numpy().astype(str)
    elif metric.kind == "label":
        try:
            _parse_floats(ans[cols[0]].to_numpy(), cols[0])
            numeric = True
        except SubmissionError:
            numeric = False
        y_true = _labels(ans[cols[0]], numeric, cols[0], ids)
        y_pred = _labels(sub[cols[0]], numeric, cols[0], ids)
    else:
        y_true = _numeric_block(ans, cols, ids)
        y_pred = _numeric_block(sub, cols, ids)
        _check_values(metric, y_pred, cols)
        if not metric.multi_column:
            y_true, y_pred = y_true[:, 0], y_pred[:, 0]
    try:
        score = float(metric.fn(y_true, y_pred))
    except Exception as e:  # noqa: BLE001 - any metric failure is reported, never swallowed
        raise SubmissionError("metric_error", f"{metric.name} failed: {type(e).__name__}: "
                              f"{str(e)[:200]}") from None
    if not math.isfinite(score):
        raise SubmissionError("metric_error", f"{metric.name} gave a non-finite score {score}")
    return score, len(ans)


def _base(task: Task, split: str, source: str) -> dict[str, Any]:
    return dict(task_id=task.id, split=split, metric=task.metric, direction=task.direction,
                reference_scores=dict(task.reference_scores.get(split, {})),
                submission_path=source)


def _invalid(task: Task, split: str, source: str, reason: str, message: str) -> GradeReport:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return GradeReport(valid=False, reason=reason, message=message, **_base(task, split, source))


def grade_bytes(task: Task, data: bytes, split: str = "reward",
                source: str = "submission.csv") -> GradeReport:
    """Grade the bytes of a submission; total for any bytes (only a broken task raises)."""
    ans = _answers(task, split)
    submission_bounds(task, split)  # a broken answers file raises here, outside the net
    try:
        score, n = _score(task, split, bytes(data), ans)
    except SubmissionError as e:
        return _invalid(task, split, source, e.reason, e.message)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile bytes must never crash the host
        return _invalid(task, split, source, "grader_error",
                        f"the grader failed on this submission ({type(e).__name__})")
    return GradeReport(valid=True, score=score, n_rows=n,
                       message=f"{task.metric} = {score:.6g} on {n} rows",
                       **_base(task, split, source))


def grade(task: Task, submission_path: str | Path, split: str = "reward") -> GradeReport:
    """Grade a user's own CSV file (the CLI's `grade --submission`) against `split`.

    Links are followed (the file is the user's, on the host); a run's submission must go
    through `grade_run`, which follows none.
    """
    path = Path(submission_path)
    got = read_host_file(path, submission_byte_cap(task, split))
    if got.data is None:
        return _invalid(task, split, str(path), got.reason or "no_file", got.message)
    return grade_bytes(task, got.data, split, source=str(path))


def grade_run(task: Task, workdir: str | Path, split: str = "reward") -> GradeReport:
    """Grade `submission/submission.csv` of a run directory, read without following links."""
    source = str(Path(workdir) / RUN_SUBMISSION)
    got = read_run_submission(Path(workdir), submission_byte_cap(task, split))
    if got.data is None:
        return _invalid(task, split, source, got.reason or "no_file", got.message)
    return grade_bytes(task, got.data, split, source=source)
