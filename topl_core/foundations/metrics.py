"""Scores shared by validation and analysis."""

from __future__ import annotations

import numpy as np


def auroc(positive: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of `scores` for binary `positive` labels; NaN when only one class (or nothing) is
    present."""
    from sklearn.metrics import roc_auc_score

    positive = np.asarray(positive).astype(int)
    if positive.size == 0 or positive.min() == positive.max():
        return float("nan")
    return float(roc_auc_score(positive, np.asarray(scores, dtype=np.float64)))


def weighted_aurocs(positive: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC of `scores` for `positive` under each row of `weights` (n_weightings, n_items): every item counted
    `weights[k, i]` times — one bootstrap resample per row, without building the resampled arrays. Ties count one
    half, as in `auroc`. NaN for a row whose weights leave one class only."""
    positive = np.asarray(positive).astype(bool)
    order = np.argsort(scores, kind="stable")
    sorted_scores = np.asarray(scores, dtype=np.float64)[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])  # groups of tied scores
    w = np.asarray(weights, dtype=np.float64)[:, order]
    pos = np.add.reduceat(w * positive[order], starts, axis=1)
    neg = np.add.reduceat(w * ~positive[order], starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg  # negative weight strictly below each group
    total = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (pos * (below + 0.5 * neg)).sum(axis=1) / total, np.nan)
