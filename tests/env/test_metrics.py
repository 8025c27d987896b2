"""Metrics against scikit-learn / NumPy references."""

import numpy as np
import pytest
from sklearn import metrics as skm

from rl4mle_jax.env import metrics as M


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_accuracy(rng):
    t, p = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    assert M.accuracy(t, p) == pytest.approx(skm.accuracy_score(t, p))


def test_roc_auc_with_ties(rng):
    t = rng.integers(0, 2, 300)
    s = rng.integers(0, 10, 300) / 10.0  # many ties
    assert M.roc_auc(t, s) == pytest.approx(skm.roc_auc_score(t, s), abs=1e-12)
    s = rng.random(300)
    assert M.roc_auc(t, s) == pytest.approx(skm.roc_auc_score(t, s), abs=1e-12)


def test_roc_auc_single_class_raises():
    with pytest.raises(ValueError, match="both classes"):
        M.roc_auc(np.ones(5), np.linspace(0, 1, 5))


def test_mean_column_auc(rng):
    t, s = rng.integers(0, 2, (150, 4)), rng.random((150, 4))
    assert M.mean_column_auc(t, s) == pytest.approx(
        skm.roc_auc_score(t, s, average="macro"), abs=1e-12)


def test_log_loss_matches_sklearn_on_normalised_rows(rng):
    y = rng.integers(0, 5, 100)
    onehot = np.eye(5)[y]
    p = rng.random((100, 5))
    p /= p.sum(1, keepdims=True)
    assert M.log_loss(onehot, p) == pytest.approx(skm.log_loss(y, p, labels=range(5)), rel=1e-10)


def test_log_loss_clips_and_renormalises():
    onehot = np.array([[1, 0, 0], [0, 1, 0]])
    p = np.array([[0.0, 0.5, 0.5], [0.2, 0.2, 0.4]])  # a zero on the truth; an unnormalised row
    eps = 1e-15
    q = np.clip(p, eps, 1 - eps)
    q = q / q.sum(1, keepdims=True)
    ref = -np.mean(np.log(q[[0, 1], [0, 1]]))
    assert M.log_loss(onehot, p) == pytest.approx(ref, rel=1e-12)
    assert M.log_loss(onehot, p) == pytest.approx((-np.log(eps / (1 + eps)) - np.log(0.25)) / 2,
                                                  rel=1e-6)


def test_regression_metrics(rng):
    t, p = rng.random(80) * 10, rng.random(80) * 10
    assert M.rmse(t, p) == pytest.approx(skm.root_mean_squared_error(t, p), rel=1e-12)
    assert M.mae(t, p) == pytest.approx(skm.mean_absolute_error(t, p), rel=1e-12)
    assert M.rmsle(t, p) == pytest.approx(skm.root_mean_squared_log_error(t, p), rel=1e-12)


def test_mean_column_rmsle(rng):
    t, p = rng.random((60, 3)) * 5, rng.random((60, 3)) * 5
    ref = np.mean([skm.root_mean_squared_log_error(t[:, k], p[:, k]) for k in range(3)])
    assert M.mean_column_rmsle(t, p) == pytest.approx(ref, rel=1e-12)
    assert M.rmsle(t, p) == pytest.approx(ref, rel=1e-12)  # several columns -> column mean


def test_jaccard_reference():
    assert M.jaccard("a b c", "b c d") == pytest.approx(2 / 4)
    assert M.jaccard("Good DAY", "good day") == 1.0
    assert M.jaccard("", "") == 1.0
    assert M.jaccard("x", "") == 0.0
    ref = np.mean([2 / 4, 1.0, 0.0])
    assert M.mean_jaccard(["a b c", "Good DAY", "x"], ["b c d", "good day", "y"]) == \
        pytest.approx(ref)


def test_quadratic_weighted_kappa(rng):
    t, p = rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    p[:200] = t[:200]
    assert M.quadratic_weighted_kappa(t, p) == pytest.approx(
        skm.cohen_kappa_score(t, p, weights="quadratic"), rel=1e-10)
    assert M.quadratic_weighted_kappa(t, t) == pytest.approx(1.0)


def test_pearson(rng):
    t = rng.random(100)
    p = t + rng.normal(0, 0.3, 100)
    assert M.pearson(t, p) == pytest.approx(np.corrcoef(t, p)[0, 1], rel=1e-12)
    assert M.pearson(t, np.ones(100)) == 0.0


def test_registry_directions():
    assert {n: m.direction for n, m in M.METRICS.items()} == {
        "accuracy": "higher", "auc": "higher", "mean_column_auc": "higher", "log_loss": "lower",
        "rmse": "lower", "rmsle": "lower", "mean_column_rmsle": "lower", "mae": "lower",
        "mean_jaccard": "higher", "qwk": "higher", "pearson": "higher"}
    with pytest.raises(KeyError, match="unknown metric 'f1'"):
        M.get_metric("f1")
