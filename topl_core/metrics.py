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
