"""The label settings of the label-sensitivity study: each a way of changing the token labels TOPL trains on.

Input: one 1-D integer array per example over its response tokens: 1 = good, 0 = bad, -1 = not supervised.
Every setting returns arrays of the same lengths (int64); removing a token from supervision sets it to -1.
Subsampling draws token positions uniformly at random over all examples together, from `seed`.

- original: the labels unchanged.
- random: the supervised labels shuffled over all supervised positions (same good/bad counts, random places).
- balanced: the majority class is subsampled to the size of the minority class (50% good / 50% bad).
- bad_skewed: subsampled to 75% bad / 25% good, keeping as many tokens as possible (the class that limits the
  ratio is kept whole, the other is subsampled).
- good_skewed: likewise 75% good / 25% bad.
- good_only: only good tokens are supervised (every bad token becomes -1).
- dense_balanced: only examples with a bad fraction (bad / supervised tokens) of at least
  DENSE_MIN_BAD_FRACTION = 0.15 are kept (the others become fully unsupervised); those are then balanced 50/50.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..foundations.errors import DataError

LABEL_SETTINGS: tuple[str, ...] = (
    "original",
    "random",
    "balanced",
    "bad_skewed",
    "good_skewed",
    "good_only",
    "dense_balanced",
)
BAD_FRACTION = {"balanced": 0.5, "bad_skewed": 0.75, "good_skewed": 0.25, "dense_balanced": 0.5}
DENSE_MIN_BAD_FRACTION = 0.15
GOOD, BAD, UNSUPERVISED = 1, 0, -1


def _checked(labels: list[np.ndarray]) -> list[np.ndarray]:
    checked = []
    for i, example in enumerate(labels):
        array = np.asarray(example)
        if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise DataError(f"labels[{i}]: expected a 1-D integer array, got shape {array.shape} dtype {array.dtype}.")
        invalid = np.setdiff1d(array, (GOOD, BAD, UNSUPERVISED))
        if invalid.size:
            raise DataError(f"labels[{i}]: values {invalid.tolist()} are not 1 (good), 0 (bad) or -1 (not supervised).")
        checked.append(array.astype(np.int64))
    return checked


def _flatten(labels: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All labels in one array, and the split points that give back the examples."""
    flat = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    return flat, np.cumsum([len(a) for a in labels])[:-1]


def _subsample_to_bad_fraction(
    labels: list[np.ndarray], bad_fraction: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Keep the most tokens whose bad share is `bad_fraction`; all others become -1."""
    flat, splits = _flatten(labels)
    good, bad = np.flatnonzero(flat == GOOD), np.flatnonzero(flat == BAD)
    if len(bad) * (1 - bad_fraction) > len(good) * bad_fraction:  # too many bad tokens: keep every good one
        n_good, n_bad = len(good), round(len(good) * bad_fraction / (1 - bad_fraction))
    else:
        n_good, n_bad = round(len(bad) * (1 - bad_fraction) / bad_fraction), len(bad)
    out = np.full_like(flat, UNSUPERVISED)
    out[rng.choice(good, n_good, replace=False)] = GOOD
    out[rng.choice(bad, n_bad, replace=False)] = BAD
    return np.split(out, splits)


def _shuffled(labels: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    flat, splits = _flatten(labels)
    supervised = flat != UNSUPERVISED
    flat = flat.copy()
    flat[supervised] = rng.permutation(flat[supervised])
    return np.split(flat, splits)


def _bad_fraction(example: np.ndarray) -> float:
    supervised = np.count_nonzero(example != UNSUPERVISED)
    return np.count_nonzero(example == BAD) / supervised if supervised else 0.0


def apply_label_setting(labels: list[np.ndarray], setting: str, seed: int) -> list[np.ndarray]:
    """The labels under one of LABEL_SETTINGS (definitions in the module docstring)."""
    if setting not in LABEL_SETTINGS:
        raise DataError(f"label setting {setting!r} is not one of {LABEL_SETTINGS}.")
    labels = _checked(labels)
    rng = np.random.default_rng(seed)
    if setting == "original":
        return labels
    if setting == "random":
        return _shuffled(labels, rng)
    if setting == "good_only":
        return [np.where(a == BAD, UNSUPERVISED, a) for a in labels]
    if setting == "dense_balanced":
        labels = [a if _bad_fraction(a) >= DENSE_MIN_BAD_FRACTION else np.full_like(a, UNSUPERVISED) for a in labels]
    return _subsample_to_bad_fraction(labels, BAD_FRACTION[setting], rng)


def label_stats(labels: list[np.ndarray]) -> dict:
    """Supervised token counts and percentages (0-100), plus the number of examples with any supervised token."""
    labels = _checked(labels)
    flat, _ = _flatten(labels)
    good, bad = int(np.count_nonzero(flat == GOOD)), int(np.count_nonzero(flat == BAD))
    tokens = good + bad
    return {
        "tokens": tokens,
        "good": good,
        "bad": bad,
        "pct_good": 100.0 * good / tokens if tokens else 0.0,
        "pct_bad": 100.0 * bad / tokens if tokens else 0.0,
        "examples": sum(bool(np.any(a != UNSUPERVISED)) for a in labels),
    }


def label_settings_table(labels: list[np.ndarray], seed: int) -> pd.DataFrame:
    """One row per setting with its label_stats."""
    return pd.DataFrame([{"setting": s, **label_stats(apply_label_setting(labels, s, seed))} for s in LABEL_SETTINGS])
