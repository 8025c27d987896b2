"""Grade a submission CSV against a task's answers; every failure has a named reason.

CSVs are read with every cell as text (no dtype inference, so pandas' object/string dtype
choice cannot matter) and numbers are parsed with Python's ``float``, which round-trips
exactly like ``pd.read_csv(float_precision="round_trip")``. Rows are aligned by id, never by
row order.

The submission is hostile input: ``grade_run`` reads it from a run directory without
following links and ``grade_bytes`` parses it within bounds (both in ``submission``) before any
DataFrame is built. Messages quote only the submission's own content (and the test ids, which
the agent has), each value and list cut short, at most MAX_MESSAGE_CHARS in all.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from rl4mle_jax.env.metrics import Metric, get_metric
from rl4mle_jax.env.submission import (  # noqa: F401 - REASONS etc. are re-exported
    MAX_MESSAGE_CHARS,
    QUOTE_CHARS,
    REASONS,
    RUN_SUBMISSION,
    SubmissionError,
    SubmissionRead,
    parse_submission,
    quote,
    quote_columns,
    quote_list,
    read_host_file,
    read_run_submission,
    submission_bounds,
    submission_byte_cap,
)

if TYPE_CHECKING:  # only for annotations: the grader does not import the task loader
    from rl4mle_jax.env.tasks import Task

# Probability rows may be off by formatting (e.g. 4 decimals over 32 classes); larger
# deviations are an error, smaller ones are renormalised away as Kaggle does.
ROW_SUM_ATOL = 1e-3
# Paired bootstrap of a valid score (GradeReport.score_boot): the metric on BOOTSTRAP_REPLICATES
# resamples of the split's rows, drawn from a seed fixed by (task, split, rows), so two
# submissions of one task are scored on the same resamples and std(boot_a - boot_b) is the
# standard error of their score difference (rl.advantages.valid_rank_bonus ties pairs within
# it). The cost is replicates x one metric call: splits above BOOTSTRAP_MAX_ROWS, or whose one
# metric call took long enough that the replicates would take over BOOTSTRAP_MAX_S (e.g. a
# word-level metric on many long texts), get none (None: the grade itself is unchanged).
BOOTSTRAP_REPLICATES = 64
BOOTSTRAP_MAX_ROWS = 100_000
BOOTSTRAP_MAX_S = 2.0
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
    # The metric on BOOTSTRAP_REPLICATES fixed resamples of the rows (None: not computed; NaN
    # where a resample leaves the metric undefined). Host-side only: no prompt shows it.
    score_boot: list[float] | None = None
    # The standard error of a typical valid score on this split (Task.reference_se), which
    # floors the "rescaled" reward's unit (env.reward.normalise_score); None: not measured.
    reference_se: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)


class TaskError(ValueError):
    """The task itself is broken (answers lack columns): the host's fault, so it raises."""


def read_csv_text(path: Path) -> pd.DataFrame:
    """Read a trusted CSV (the host's answers) with all cells as Python str ("" when empty)."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[])
    df.columns = [str(c).strip() for c in df.columns]
    return df.astype(object)


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
                              f"column {quote(column)} has non-numeric values: {quote_list(bad)}")
    return out


def _numeric_block(df: pd.DataFrame, columns: list[str], ids: list[str]) -> np.ndarray:
    """[N, K] floats; raises on non-numeric, NaN and infinite cells (naming the column)."""
    cols = [_parse_floats(df[c].to_numpy(), c) for c in columns]
    arr = np.stack(cols, axis=1)
    for k, c in enumerate(columns):
        nan = np.isnan(arr[:, k])
        if nan.any():
            raise SubmissionError("nan_values", f"column {quote(c)} has {int(nan.sum())} "
                                  f"missing/NaN values (ids {quote_list(np.asarray(ids)[nan])})")
        inf = np.isinf(arr[:, k])
        if inf.any():
            raise SubmissionError("inf_values", f"column {quote(c)} has {int(inf.sum())} infinite "
                                  f"values (ids {quote_list(np.asarray(ids)[inf])})")
    return arr


def _check_values(metric: Metric, arr: np.ndarray, columns: list[str]) -> None:
    if metric.kind in ("probability", "distribution"):
        out = (arr < 0) | (arr > 1)
        if out.any():
            k = int(np.argmax(out.any(axis=0)))
            raise SubmissionError("prob_out_of_range", f"{int(out.sum())} probabilities outside "
                                  f"[0, 1] (first in column {quote(columns[k])})")
    if metric.kind == "distribution":
        sums = arr.sum(axis=1)
        off = np.abs(sums - 1.0) > ROW_SUM_ATOL
        if off.any():
            raise SubmissionError("prob_rows_not_normalised", f"{int(off.sum())} rows of "
                                  f"probabilities over {quote_columns(columns)} do not sum to "
                                  f"1 (e.g. {sums[off][0]:.6g}; tolerance {ROW_SUM_ATOL})")
    if metric.kind == "nonnegative" and (arr < 0).any():
        raise SubmissionError("negative_values", f"{int((arr < 0).sum())} negative predictions; "
                              f"{metric.name} needs values >= 0")
    if metric.kind == "integer" and (np.abs(arr - np.round(arr)) > 1e-9).any():
        raise SubmissionError("non_integer_values", f"{metric.name} needs integer ratings")


def _labels(series: pd.Series, numeric: bool, column: str, ids: list[str]) -> np.ndarray:
    vals = series.map(lambda s: str(s).strip()).to_numpy()
    empty = np.array([v.lower() in _NAN_TEXT for v in vals])
    if empty.any():
        raise SubmissionError("nan_values", f"column {quote(column)} has {int(empty.sum())} empty "
                              f"labels (ids {quote_list(np.asarray(ids)[empty])})")
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
        raise SubmissionError("duplicate_ids", f"ids appear more than once: {quote_list(dup)}"
                              + (f"; {len(missing)} test ids missing" if missing else ""))
    if n_sub == n_ans and missing:
        raise SubmissionError("missing_ids", f"{len(missing)} ids of the test set are missing "
                              f"(e.g. {quote_list(missing)}); {len(extra)} rows have ids that are "
                              f"not in the test set (e.g. {quote_list(extra)})")
    if n_sub < n_ans and missing and not extra:
        raise SubmissionError("missing_ids", f"{len(missing)} ids of the test set are missing "
                              f"(e.g. {quote_list(missing)}); expected {n_ans} rows, got {n_sub}")
    if n_sub > n_ans and extra and not missing:
        raise SubmissionError("extra_ids", f"{len(extra)} ids are not in the test set "
                              f"(e.g. {quote_list(extra)}); expected {n_ans} rows, got {n_sub}")
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


def bootstrap_rows(task_id: str, split: str, n: int,
                   replicates: int = BOOTSTRAP_REPLICATES) -> np.ndarray:
    """The resamples (row indices, [replicates, n]) every submission of (task, split) shares."""
    seed = zlib.crc32(f"{task_id}\0{split}\0{n}".encode())
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n))


def bootstrap_scores(metric: Metric, y_true: Any, y_pred: Any, rows_rn: np.ndarray
                     ) -> list[float]:
    """The metric on each resample of rows_rn; NaN where it fails or is not finite."""
    out = []
    for rows in rows_rn:
        try:
            v = float(metric.fn(y_true[rows], y_pred[rows]))
        except Exception:  # noqa: BLE001 - e.g. a resample with one class: no replicate
            v = math.nan
        out.append(v if math.isfinite(v) else math.nan)
    return out


def _score(task: Task, split: str, data: bytes, ans: pd.DataFrame
           ) -> tuple[float, int, list[float] | None]:
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
    started = time.perf_counter()
    try:
        score = float(metric.fn(y_true, y_pred))
    except Exception as e:  # noqa: BLE001 - any metric failure is reported, never swallowed
        raise SubmissionError("metric_error", f"{metric.name} failed: {type(e).__name__}: "
                              f"{str(e)[:200]}") from None
    if not math.isfinite(score):
        raise SubmissionError("metric_error", f"{metric.name} gave a non-finite score {score}")
    n = len(ans)
    boot = None
    one_call_s = time.perf_counter() - started
    if 2 <= n <= BOOTSTRAP_MAX_ROWS and one_call_s * BOOTSTRAP_REPLICATES <= BOOTSTRAP_MAX_S:
        boot = bootstrap_scores(metric, np.asarray(y_true), np.asarray(y_pred),
                                bootstrap_rows(task.id, split, n))
    return score, n, boot


def _base(task: Task, split: str, source: str) -> dict[str, Any]:
    return dict(task_id=task.id, split=split, metric=task.metric, direction=task.direction,
                reference_scores=dict(task.reference_scores.get(split, {})),
                reference_se=(task.reference_se or {}).get(split), submission_path=source)


def invalid_report(task: Task, split: str, source: str, reason: str, message: str
                   ) -> GradeReport:
    """The report of a submission that could not be graded, `reason` one of REASONS."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    return GradeReport(valid=False, reason=reason, message=message, **_base(task, split, source))


def grade_bytes(task: Task, data: bytes, split: str = "reward",
                source: str = "submission.csv") -> GradeReport:
    """Grade the bytes of a submission; total for any bytes (only a broken task raises)."""
    ans = _answers(task, split)
    submission_bounds(task, split)  # a broken answers file raises here, outside the net
    try:
        score, n, boot = _score(task, split, bytes(data), ans)
    except SubmissionError as e:
        return invalid_report(task, split, source, e.reason, e.message)
    except TaskError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile bytes must never crash the host
        return invalid_report(task, split, source, "grader_error",
                        f"the grader failed on this submission ({type(e).__name__})")
    return GradeReport(valid=True, score=score, n_rows=n, score_boot=boot,
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
        return invalid_report(task, split, str(path), got.reason or "no_file", got.message)
    return grade_bytes(task, got.data, split, source=str(path))


def grade_run(task: Task, workdir: str | Path, split: str = "reward") -> GradeReport:
    """Grade `submission/submission.csv` of a run directory, read without following links.

    The report names the file relative to the run (no host path reaches the agent)."""
    return grade_run_bytes(task, workdir, split)[0]


def grade_run_bytes(task: Task, workdir: str | Path, split: str = "reward"
                    ) -> tuple[GradeReport, bytes | None]:
    """`grade_run`, also returning the bytes that were graded (None when they could not be
    read safely)."""
    return grade_read(task, read_run_submission(Path(workdir), submission_byte_cap(task, split)),
                      split)


def grade_read(task: Task, got: SubmissionRead, split: str = "reward"
               ) -> tuple[GradeReport, bytes | None]:
    """Grade a submission already read safely from a run dir (here, or on the node that ran
    it: the Ray backend reads under the global cap, so this task's own cap is applied here)."""
    source, cap = RUN_SUBMISSION, submission_byte_cap(task, split)
    if got.data is not None and len(got.data) > cap:
        got = SubmissionRead(None, "too_large", f"{source} is {len(got.data)} bytes; the limit "
                             f"for this task is {cap} bytes")
    if got.data is None:
        return invalid_report(task, split, source, got.reason or "no_file", got.message), None
    return grade_bytes(task, got.data, split, source=source), got.data
