"""Shared machinery of the local task builders: definition, files, description, checksums."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rl4mle_jax.env.datasets.splits import checksums, split_indices, verify_checksums, write_csv
from rl4mle_jax.env.metrics import METRICS

BUILDER_VERSION = 1
TEST_FRACTION = 0.2
SEED = 0

METRIC_TEXT = {
    "auc": "area under the ROC curve (AUC) between the predicted probability and the observed "
           "0/1 target; higher is better",
    "log_loss": "multi-class logarithmic loss; each row's probabilities are clipped to "
                "[1e-15, 1 - 1e-15] and renormalised to sum to 1; lower is better",
    "accuracy": "accuracy (fraction of correctly predicted labels); higher is better",
    "rmse": "root mean squared error; lower is better",
    "rmsle": "root mean squared logarithmic error, sqrt(mean((log(1 + pred) - log(1 + true))^2)); "
             "lower is better",
    "mean_column_rmsle": "RMSLE computed per target column, then averaged over the columns; "
                         "lower is better",
    "qwk": "quadratic weighted kappa between predicted and true integer ratings; higher is better",
}


@dataclass(frozen=True)
class Raw:
    """What a loader returns: all rows (with an `id` column) and optionally a native test mask."""

    frame: pd.DataFrame
    test_mask: np.ndarray | None = None


@dataclass(frozen=True)
class LocalTask:
    """Definition of one local task.

    kind: "binary" (target 0/1, submit a probability), "proba" (label column, submit one
      probability column per class), "label" (submit the label), "regression" (submit numbers).
    """

    id: str
    title: str
    source: str
    metric: str
    kind: str
    load: Callable[[], Raw]
    targets: tuple[str, ...] = ()  # answer columns; for "proba" the class names
    label_column: str | None = None  # "proba": train column holding the class name
    overview: str = ""
    columns_doc: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    has_strong: bool = True


def stable_ids(n: int, seed: int) -> np.ndarray:
    """Ids 1..n in a random order, so neither ids nor row order leak the source's sorting."""
    return np.random.default_rng(seed).permutation(n) + 1


def shuffle_with_ids(df: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Random row order and fresh `id` column (first)."""
    order = np.random.default_rng(seed).permutation(len(df))
    out = df.iloc[order].reset_index(drop=True)
    out.insert(0, "id", stable_ids(len(out), seed + 1))
    return out


def subsample(df: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    if len(df) <= n:
        return df.reset_index(drop=True)
    keep = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return df.iloc[keep].reset_index(drop=True)


def _sample_submission(d: LocalTask, train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    n = len(test)
    cols: dict[str, object] = {"id": test["id"].to_numpy()}
    if d.kind == "proba":
        for c in d.targets:
            cols[c] = np.full(n, 1.0 / len(d.targets))
    elif d.kind == "binary":
        cols[d.targets[0]] = np.full(n, 0.5)
    elif d.kind == "label":
        cols[d.targets[0]] = np.full(n, train[d.targets[0]].mode().iloc[0])
    else:
        for c in d.targets:
            cols[c] = np.full(n, round(float(train[c].median()), 4))
    return pd.DataFrame(cols)


def _answers(d: LocalTask, test: pd.DataFrame) -> pd.DataFrame:
    if d.kind == "proba":
        onehot = {c: (test[d.label_column].astype(str) == c).astype(int).to_numpy()
                  for c in d.targets}
        return pd.DataFrame({"id": test["id"].to_numpy(), **onehot})
    return test[["id", *d.targets]].reset_index(drop=True)


def describe(d: LocalTask, train: pd.DataFrame, test: pd.DataFrame) -> str:
    hidden = set(d.targets) | ({d.label_column} if d.label_column else set())
    feats = [c for c in train.columns if c not in hidden and c != "id"]
    lines = [f"# {d.title}", "", "## Overview", "", d.overview.strip(), "",
             "## Data", "",
             "- `train.csv`: features and the target, one row per example.",
             "- `test.csv`: the same features without the target; predict these rows.",
             "- `sample_submission.csv`: a submission in the correct format.", "",
             f"Columns: `id` (row identifier), features "
             f"{', '.join('`' + c + '`' for c in feats[:12])}"
             f"{f' and {len(feats) - 12} more' if len(feats) > 12 else ''}."]
    for name, doc in d.columns_doc.items():
        lines.append(f"- `{name}`: {doc}")
    if d.kind == "proba":
        target_doc = (f"The target is the column `{d.label_column}` of train.csv, one of "
                      f"{len(d.targets)} classes: {', '.join(d.targets)}.")
    else:
        target_doc = f"The target is {', '.join('`' + t + '`' for t in d.targets)}."
    lines += ["", target_doc, "", "## Evaluation", "",
              f"Submissions are scored by {METRIC_TEXT.get(d.metric, d.metric)}.", "",
              "## Submission format", "",
              "Write `./submission/submission.csv` with a header and one row per test id:", "",
              "```", ",".join(["id", *d.targets][:8]) + (",..." if len(d.targets) > 7 else "")]
    if d.kind == "proba":
        lines.append("17," + ",".join([f"{1 / len(d.targets):.4f}"] * min(len(d.targets), 7)))
        lines += ["```", "", "Each row holds one probability per class; rows must sum to 1."]
    elif d.kind == "binary":
        lines += ["17,0.73", "```", "", "The value is the predicted probability of class 1."]
    else:
        lines += ["17," + ",".join(["..."] * len(d.targets)), "```"]
    return "\n".join(lines) + "\n"


def data_digest(sums: dict[str, str]) -> str:
    """Digest of a prepared task's data files: the reward view's manifest (how it was made,
    not what it holds) is left out, so recorded reference scores stay tied to the data."""
    data = {k: v for k, v in sums.items() if k != "reward/manifest.json"}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def is_current(root: Path) -> bool:
    """Prepared task at `root` is complete, current, and its files match their checksums."""
    spec_p, sums_p = root / "task.json", root / "checksums.json"
    if not (spec_p.exists() and sums_p.exists()):
        return False
    spec = json.loads(spec_p.read_text())
    if spec.get("builder_version") != BUILDER_VERSION:
        return False
    sums = json.loads(sums_p.read_text())
    return bool(sums) and not verify_checksums(root, sums)


def write_local_task(d: LocalTask, root: Path) -> dict:
    """Write public/, private/, description, task.json and the reward view; returns the spec."""
    raw = d.load()
    df = raw.frame
    if raw.test_mask is not None:
        test_mask = np.asarray(raw.test_mask, dtype=bool)
    else:
        _, test_pos = split_indices(len(df), TEST_FRACTION, SEED)
        test_mask = np.zeros(len(df), dtype=bool)
        test_mask[test_pos] = True
    train, test = df[~test_mask].reset_index(drop=True), df[test_mask].reset_index(drop=True)
    hidden = [c for c in [*d.targets, d.label_column] if c and c in df.columns]

    if root.exists():
        shutil.rmtree(root)
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir()
    description = describe(d, train, test)
    (root / "description.md").write_text(description)
    (root / "public" / "description.md").write_text(description)
    write_csv(train, root / "public" / "train.csv")
    write_csv(test.drop(columns=hidden), root / "public" / "test.csv")
    write_csv(_sample_submission(d, train, test), root / "public" / "sample_submission.csv")
    write_csv(_answers(d, test), root / "private" / "answers.csv")
    spec = dict(id=d.id, title=d.title, source=d.source, metric=d.metric,
                direction=METRICS[d.metric].direction, id_column="id",
                target_columns=list(d.targets), label_column=d.label_column,
                answers_file="answers.csv", sample_submission_file="sample_submission.csv",
                train_file="train.csv", test_file="test.csv", timeout_s=d.timeout_s,
                reward_fraction=TEST_FRACTION, reward_seed=SEED,
                n_train=len(train), n_test=len(test), builder_version=BUILDER_VERSION,
                reference_scores={})
    (root / "task.json").write_text(json.dumps(spec, indent=1))
    return spec


def finish_checksums(root: Path) -> dict[str, str]:
    sums = checksums(root, ["public", "private", "reward"])
    (root / "checksums.json").write_text(json.dumps(sums, indent=1, sort_keys=True))
    return sums
