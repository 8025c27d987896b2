"""Write a task directory (or only its task.json) from a user's CSVs.

    python -m rl4mle_jax.env new DIR --metric auc --id-column id --target y --from data.csv
    python -m rl4mle_jax.env new DIR --metric log_loss --id-column id --label-column species

With ``--from CSV`` (one labelled table) the rows are split, seeded, into public train/test,
and ``private/answers.csv``, a sample submission and a description template are written. Without
it, DIR already holds ``public/`` (train, test, maybe a sample submission) and ``private/``
(the answers), and only ``task.json`` is written. Either way the result is validated
(`env.validate`), and nothing the user made is overwritten.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rl4mle_jax.env.datasets.common import METRIC_TEXT
from rl4mle_jax.env.datasets.splits import split_indices, write_csv
from rl4mle_jax.env.metrics import METRICS
from rl4mle_jax.env.tasks import TaskSpecError


def _placeholder(kind: str, train: pd.DataFrame, targets: list[str], n: int) -> dict:
    """A valid but uninformed prediction per target column (the sample submission)."""
    if kind == "distribution":
        return {c: np.full(n, round(1.0 / len(targets), 6)) for c in targets}
    if kind == "probability":
        return {c: np.full(n, 0.5) for c in targets}
    out = {}
    for c in targets:
        col = train[c] if c in train.columns else pd.Series(["0"])
        if kind in ("numeric", "nonnegative"):
            out[c] = np.full(n, round(float(pd.to_numeric(col).median()), 6))
        else:  # integer ratings, labels, text: the most frequent value
            out[c] = np.full(n, col.mode().iloc[0], dtype=object)
    return out


def _description(task_id: str, metric: str, id_column: str, targets: list[str],
                 label_column: str | None, sample: pd.DataFrame) -> str:
    kind = METRICS[metric].kind
    head = ",".join(sample.columns[:8]) + (",..." if len(sample.columns) > 8 else "")
    row = ",".join(str(v) for v in sample.iloc[0].tolist()[:8])
    lines = [f"# {task_id}", "", "## Submission format", "",
             "Write `./submission/submission.csv` with a header and one row per id of "
             "`test.csv`:", "", "```", head, row, "```", ""]
    if kind == "distribution":
        lines.append(f"Each row holds one probability per class ({len(targets)} classes of "
                     f"`{label_column}` in train.csv); rows must sum to 1.")
    elif kind == "probability":
        lines.append("The value is the predicted probability of class 1.")
    lines += ["", "## Evaluation", "",
              f"Submissions are scored by {METRIC_TEXT.get(metric, metric)}.", "",
              "## Data", "",
              f"- `train.csv`: one row per example, `{id_column}` names it; the target is "
              + (f"`{label_column}`." if label_column else
                 ", ".join(f"`{t}`" for t in targets) + "."),
              "- `test.csv`: the same columns without the target; predict these rows.",
              "- `sample_submission.csv`: a submission in the correct format.", "",
              "<!-- Describe the problem and the columns here, after the format: a long "
              "description is cut at the end to fit the prompt. -->", ""]
    return "\n".join(lines)


def new_task(path: str | Path, *, metric: str, id_column: str,
             targets: list[str] | None = None, label_column: str | None = None,
             source: str | Path | None = None, task_id: str | None = None,
             test_fraction: float = 0.2, seed: int = 0, force: bool = False) -> dict[str, Any]:
    """Write the task (see the module docstring); returns what was written."""
    path = Path(path).expanduser().resolve()
    if metric not in METRICS:
        raise TaskSpecError(f"--metric must be one of {sorted(METRICS)}, got {metric!r}")
    kind = METRICS[metric].kind
    task_id = task_id or path.name
    written: list[str] = []
    if source is not None:
        if path.exists() and any(path.iterdir()) and not force:
            raise TaskSpecError(f"{path} exists and is not empty; --from writes a whole task "
                                "directory (give a new DIR, or --force to replace its files)")
        df = pd.read_csv(Path(source).expanduser(), dtype=str, keep_default_na=False,
                         na_values=[])
        df.columns = [str(c).strip() for c in df.columns]
        if id_column not in df.columns:  # number the rows into the id column
            df.insert(0, id_column, [str(i) for i in range(len(df))])
        if label_column is not None:
            if label_column not in df.columns:
                raise TaskSpecError(f"--label-column {label_column!r} is not a column of "
                                    f"{source} (columns {list(df.columns)[:10]})")
            targets = targets or sorted(df[label_column].astype(str).unique().tolist())
        if not targets:
            raise TaskSpecError("give --target COLUMN (or --label-column for class "
                                "probabilities)")
        missing = [t for t in targets if t not in df.columns and label_column is None]
        if missing:
            raise TaskSpecError(f"--target {missing} not columns of {source} (columns "
                                f"{list(df.columns)[:10]})")
        keep, hold = split_indices(len(df), test_fraction, seed)
        train, test = df.iloc[keep].reset_index(drop=True), df.iloc[hold].reset_index(drop=True)
        hidden = [c for c in [*targets, label_column] if c and c in df.columns]
        if kind == "distribution" and label_column is not None:
            labels = test[label_column].astype(str)
            answers = pd.DataFrame({id_column: test[id_column],
                                    **{c: (labels == c).astype(int) for c in targets}})
        else:
            answers = test[[id_column, *targets]]
        sample = pd.DataFrame({id_column: test[id_column],
                               **_placeholder(kind, train, targets, len(test))})
        write_csv(train, path / "public" / "train.csv")
        write_csv(test.drop(columns=hidden), path / "public" / "test.csv")
        write_csv(sample, path / "public" / "sample_submission.csv")
        write_csv(answers, path / "private" / "answers.csv")
        (path / "description.md").write_text(_description(task_id, metric, id_column, targets,
                                                          label_column, sample))
        written += ["public/train.csv", "public/test.csv", "public/sample_submission.csv",
                    "private/answers.csv", "description.md"]
    else:
        if not (path / "public").is_dir() or not (path / "private").is_dir():
            raise TaskSpecError(f"{path}: needs public/ (train.csv, test.csv) and private/ "
                                "(the answers), or give --from data.csv to make them")
        if not targets and label_column is None:
            raise TaskSpecError("give --target COLUMN (or --label-column for class "
                                "probabilities)")
        if not targets:
            train = pd.read_csv(path / "public" / "train.csv", dtype=str,
                                keep_default_na=False, usecols=[label_column])
            targets = sorted(train[label_column].astype(str).unique().tolist())
    spec_p = path / "task.json"
    if spec_p.exists() and not force:
        raise TaskSpecError(f"{spec_p} exists; --force replaces it")
    spec: dict[str, Any] = {"id": task_id, "metric": metric, "id_column": id_column,
                            "target_columns": list(targets)}
    if label_column is not None:
        spec["label_column"] = label_column
    path.mkdir(parents=True, exist_ok=True)
    spec_p.write_text(json.dumps(spec, indent=1) + "\n")
    written.append("task.json")
    return {"dir": str(path), "written": written, "task": spec}
