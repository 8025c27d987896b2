"""Competition metrics as plain NumPy functions (no sklearn at grading time, no jax).

Every metric takes aligned arrays: ``y_true`` and ``y_pred`` with one row per test example
(2-D ``[N, K]`` where a metric is column-wise). Validation of the submission (NaN, ranges,
row sums) happens in ``grading``; these functions assume clean inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

LOG_LOSS_EPS = 1e-15
DIRECTIONS = ("higher", "lower")  # which way a metric's score improves


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of exact matches (labels already canonicalised by the caller)."""
    y_true, y_pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    return float(np.mean(y_true == y_pred))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    # Boundaries of runs of equal values.
    starts = np.r_[0, np.flatnonzero(xs[1:] != xs[:-1]) + 1]
    ends = np.r_[starts[1:], len(xs)]
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks_sorted = np.repeat(avg, ends - starts)
    ranks = np.empty_like(ranks_sorted)
    ranks[order] = ranks_sorted
    return ranks


def roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """Binary ROC AUC via the Mann-Whitney U statistic (ties count one half)."""
    y_true = np.asarray(y_true, dtype=float).ravel()
    y_score = np.asarray(y_score, dtype=float).ravel()
    pos = y_true == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs both classes in y_true")
    ranks = _average_ranks(y_score)
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def mean_column_auc(y_true_nk: np.ndarray, y_score_nk: np.ndarray) -> float:
    """Mean over columns of the binary ROC AUC (jigsaw-style)."""
    y_true_nk, y_score_nk = np.atleast_2d(y_true_nk.T).T, np.atleast_2d(y_score_nk.T).T
    return float(np.mean([roc_auc(y_true_nk[:, k], y_score_nk[:, k])
                          for k in range(y_true_nk.shape[1])]))


def log_loss(y_true_nk: np.ndarray, y_prob_nk: np.ndarray, eps: float = LOG_LOSS_EPS) -> float:
    """Multi-class log loss as Kaggle computes it: clip to [eps, 1-eps], renormalise rows.

    Args:
      y_true_nk: one-hot (or 0/1) answers [N, K].
      y_prob_nk: predicted probabilities [N, K].
    """
    y_true_nk = np.asarray(y_true_nk, dtype=float)
    p = np.clip(np.asarray(y_prob_nk, dtype=float), eps, 1 - eps)
    p = p / p.sum(axis=1, keepdims=True)
    return float(-np.mean(np.sum(y_true_nk * np.log(p), axis=1)))


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    d = np.asarray(y_pred, dtype=float) - np.asarray(y_true, dtype=float)
    return float(np.sqrt(np.mean(d**2)))


def mae(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    d = np.asarray(y_pred, dtype=float) - np.asarray(y_true, dtype=float)
    return float(np.mean(np.abs(d)))


def rmsle(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared log error; several columns -> mean of the per-column RMSLE."""
    t = np.asarray(y_true, dtype=float)
    p = np.asarray(y_pred, dtype=float)
    if t.ndim == 2 and t.shape[1] > 1:
        return mean_column_rmsle(t, p)
    return rmse(np.log1p(t.ravel()), np.log1p(p.ravel()))


def mean_column_rmsle(y_true_nk: np.ndarray, y_pred_nk: np.ndarray) -> float:
    """Mean over columns of the RMSLE (nomad2018-style)."""
    t, p = np.asarray(y_true_nk, dtype=float), np.asarray(y_pred_nk, dtype=float)
    return float(np.mean([rmse(np.log1p(t[:, k]), np.log1p(p[:, k])) for k in range(t.shape[1])]))


def jaccard(a: str, b: str) -> float:
    """Word-level Jaccard of two strings (lower-cased, whitespace split); two empties give 1."""
    sa, sb = set(str(a).lower().split()), set(str(b).lower().split())
    if not sa and not sb:
        return 1.0
    inter = len(sa & sb)
    return inter / (len(sa) + len(sb) - inter)


def mean_jaccard(y_true: Sequence[str], y_pred: Sequence[str]) -> float:
    """Mean word-level Jaccard (tweet-sentiment-extraction)."""
    t, p = np.asarray(y_true, dtype=object).ravel(), np.asarray(y_pred, dtype=object).ravel()
    return float(np.mean([jaccard(a, b) for a, b in zip(t, p)]))


def quadratic_weighted_kappa(y_true: np.ndarray, y_pred: np.ndarray,
                             labels: Sequence[int] | None = None) -> float:
    """Cohen's kappa with quadratic weights over integer ratings."""
    t = np.asarray(y_true).ravel().astype(np.int64)
    p = np.asarray(y_pred).ravel().astype(np.int64)
    cats = np.asarray(sorted(set(t) | set(p)) if labels is None else labels)
    index = {c: i for i, c in enumerate(cats.tolist())}
    k = len(cats)
    observed = np.zeros((k, k))
    np.add.at(observed, ([index[v] for v in t.tolist()], [index[v] for v in p.tolist()]), 1.0)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / observed.sum()
    i, j = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    weights = (i - j) ** 2 / max((k - 1) ** 2, 1)
    denom = (weights * expected).sum()
    if denom == 0:
        return 1.0
    return float(1.0 - (weights * observed).sum() / denom)


def pearson(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Pearson correlation; 0 when the prediction is constant (no signal, not NaN)."""
    t = np.asarray(y_true, dtype=float).ravel()
    p = np.asarray(y_pred, dtype=float).ravel()
    tc, pc = t - t.mean(), p - p.mean()
    denom = np.sqrt((tc**2).sum() * (pc**2).sum())
    return float((tc * pc).sum() / denom) if denom > 0 else 0.0


@dataclass(frozen=True)
class Metric:
    """A named metric and what the grader must check before calling it.

    kind: "probability" (numeric in [0, 1]), "distribution" (probability rows that sum to 1),
      "numeric", "nonnegative" (RMSLE), "integer" (QWK), "label" (compared as labels),
      "text" (free text; NaN read as empty string).
    """

    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    direction: str  # "higher" | "lower"
    kind: str
    multi_column: bool = False  # scores all target columns jointly (else needs exactly one)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("accuracy", accuracy, "higher", "label"),
        Metric("auc", mean_column_auc, "higher", "probability", multi_column=True),
        Metric("mean_column_auc", mean_column_auc, "higher", "probability", multi_column=True),
        Metric("log_loss", log_loss, "lower", "distribution", multi_column=True),
        Metric("rmse", rmse, "lower", "numeric"),
        Metric("rmsle", rmsle, "lower", "nonnegative", multi_column=True),
        Metric("mean_column_rmsle", mean_column_rmsle, "lower", "nonnegative", multi_column=True),
        Metric("mae", mae, "lower", "numeric"),
        Metric("mean_jaccard", mean_jaccard, "higher", "text"),
        Metric("qwk", quadratic_weighted_kappa, "higher", "integer"),
        Metric("pearson", pearson, "higher", "numeric"),
    ]
}


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; known: {sorted(METRICS)}")
    return METRICS[name]


def oriented_score(score: float | None, direction: str) -> float:
    """The score oriented so that larger is better (negated when lower is better); a missing
    score ranks last (-inf). The one place in the package that decides a score's sign."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if score is None:
        return float("-inf")
    return score if direction == "higher" else -score
