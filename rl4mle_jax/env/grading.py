"""Grade a submission CSV against a task's answers; every failure has a named reason.

CSVs are read with every cell as text (no dtype inference, so pandas' object/string dtype
choice cannot matter) and numbers are parsed with Python's ``float``, which round-trips
exactly like ``pd.read_csv(float_precision="round_trip")``. Rows are aligned by id, never by
row order.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl4mle_jax.env.metrics import Metric, get_metric
from rl4mle_jax.env.tasks import Task

# Named failure reasons (the `reason` field of an invalid report).
REASONS = (
    "no_file", "unreadable_csv", "missing_columns", "extra_columns", "wrong_row_count",
    "missing_ids", "extra_ids", "duplicate_ids", "nan_values", "inf_values",
    "non_numeric_values", "prob_out_of_range", "prob_rows_not_normalised",
    "negative_values", "non_integer_values", "metric_error",
)
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


class SubmissionError(Exception):
    """Invalid submission, with a named reason."""

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason, self.message = reason, message


def read_csv_text(path: Path) -> pd.DataFrame:
    """Read a CSV with all cells as Python str (empty cells as "")."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    df.columns = [str(c).strip() for c in df.columns]
    return df.astype(object)


def _examples(values: Any, k: int = 5) -> str:
    values = list(values)
    more = f" (+{len(values) - k} more)" if len(values) > k else ""
    return ", ".join(repr(v) for v in values[:k]) + more


def _keys(ids: pd.Series) -> pd.Series:
    """Alignment keys: the id, plus its occurrence number when ids repeat in the answers."""
    ids = ids.map(lambda s: str(s).strip())
    occ = ids.groupby(ids).cumcount()
    return ids + "\x00" + occ.astype(str)


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
                              f"column {column!r} has non-numeric values: {_examples(bad)}")
    return out


def _numeric_block(df: pd.DataFrame, columns: list[str], ids: list[str]) -> np.ndarray:
    """[N, K] floats; raises on non-numeric, NaN and infinite cells (naming the column)."""
    cols = [_parse_floats(df[c].to_numpy(), c) for c in columns]
    arr = np.stack(cols, axis=1)
    for k, c in enumerate(columns):
        nan = np.isnan(arr[:, k])
        if nan.any():
            raise SubmissionError("nan_values", f"column {c!r} has {int(nan.sum())} missing/NaN "
                                  f"values (ids {_examples(np.asarray(ids)[nan])})")
        inf = np.isinf(arr[:, k])
        if inf.any():
            raise SubmissionError("inf_values", f"column {c!r} has {int(inf.sum())} infinite "
                                  f"values (ids {_examples(np.asarray(ids)[inf])})")
    return arr


def _check_values(metric: Metric, arr: np.ndarray, columns: list[str]) -> None:
    if metric.kind in ("probability", "distribution"):
        out = (arr < 0) | (arr > 1)
        if out.any():
            k = int(np.argmax(out.any(axis=0)))
            raise SubmissionError("prob_out_of_range", f"{int(out.sum())} probabilities outside "
                                  f"[0, 1] (first in column {columns[k]!r})")
    if metric.kind == "distribution":
        sums = arr.sum(axis=1)
        off = np.abs(sums - 1.0) > ROW_SUM_ATOL
        if off.any():
            raise SubmissionError("prob_rows_not_normalised", f"{int(off.sum())} rows of "
                                  f"probabilities over {columns} do not sum to 1 (e.g. "
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
        raise SubmissionError("nan_values", f"column {column!r} has {int(empty.sum())} empty "
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
    """Index into `sub` for each answers row; raises on id problems."""
    idc = task.id_column
    ans_keys, sub_keys = _keys(ans[idc]), _keys(sub[idc])
    ans_unique = not ans[idc].duplicated().any()
    ans_set, sub_set = set(ans_keys), set(sub_keys)
    missing = [k.split("\x00")[0] for k in ans_keys if k not in sub_set]
    extra = [k.split("\x00")[0] for k in sub_keys if k not in ans_set]
    dup = sub[idc].map(lambda s: str(s).strip())
    dup = sorted(set(dup[dup.duplicated()])) if ans_unique else []
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
    pos = pd.Series(np.arange(n_sub), index=sub_keys.to_numpy())
    return pos.loc[ans_keys.to_numpy()].to_numpy()


def _score(task: Task, split: str, path: Path) -> tuple[float, int]:
    metric = get_metric(task.metric)
    if not path.exists():
        raise SubmissionError("no_file", f"no submission file at {path}")
    if path.is_dir() or path.stat().st_size == 0:
        raise SubmissionError("unreadable_csv", f"{path.name} is empty or not a file")
    try:
        sub = read_csv_text(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise SubmissionError("unreadable_csv", f"cannot parse {path.name} as CSV: "
                              f"{type(e).__name__}: {str(e)[:300]}") from None
    expected = _expected_columns(task, split)
    missing_cols = [c for c in expected if c not in sub.columns]
    if missing_cols:
        raise SubmissionError("missing_columns", f"missing columns {missing_cols}; expected "
                              f"{expected}, got {list(sub.columns)}")
    extra_cols = [c for c in sub.columns if c not in expected]
    if extra_cols:
        raise SubmissionError("extra_columns", f"unexpected columns {extra_cols}; expected "
                              f"{expected}")
    ans = _read_answers(task.answers_path(split))
    lacking = [c for c in [task.id_column, *task.target_columns] if c not in ans.columns]
    if lacking:  # a broken task, not a broken submission: fail loudly
        raise ValueError(f"answers file {task.answers_path(split)} lacks columns {lacking}")
    idx = _align(task, sub, ans)
    sub = sub.iloc[idx].reset_index(drop=True)
    ids = ans[task.id_column].tolist()
    cols = list(task.target_columns)
    if not metric.multi_column and len(cols) != 1:
        raise ValueError(f"metric {metric.name} scores one column, task has {cols}")
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
        raise SubmissionError("metric_error", f"{metric.name} failed: {type(e).__name__}: {e}") \
            from None
    if not math.isfinite(score):
        raise SubmissionError("metric_error", f"{metric.name} gave a non-finite score {score}")
    return score, len(ans)


def grade(task: Task, submission_path: str | Path, split: str = "reward") -> GradeReport:
    """Grade `submission_path` against the answers of `split` ("reward" or "test")."""
    path = Path(submission_path)
    base = dict(task_id=task.id, split=split, metric=task.metric, direction=task.direction,
                reference_scores=dict(task.reference_scores.get(split, {})),
                submission_path=str(path))
    try:
        score, n = _score(task, split, path)
    except SubmissionError as e:
        return GradeReport(valid=False, reason=e.reason, message=e.message, **base)
    return GradeReport(valid=True, score=score, n_rows=n,
                       message=f"{task.metric} = {score:.6g} on {n} rows", **base)
