"""Token-level detection's figures on labelled tokens (transfer.py's table, score-tokens' summary, a saved
reproduction report judged again, scripts/lexical_controls.py): the labelled tokens of scored records as arrays — the
record each token is in, bad (1) / good (0), each detector's score (how bad the token looks) — and each detector's
AUROC of flagging the bad ones, with a 95% percentile bootstrap CI that resamples records (tokens of one record are
correlated), the same resamples for every detector.

    DETECTORS                                                          the head, the frozen probe, surprisal, controls
    bootstrap_auroc(bad, scores, groups, n, seed) -> {detector: AurocCI}
    paired_auroc_draws(bad, a, b, groups, n, seed) -> (AUROC(a) − AUROC(b), the difference per record resample)
    token_arrays(records, scores) -> {record, bad, detector: scores}   the labelled tokens of scored records
    detection_summary(records, scores, bootstrap, seed) -> dict        one set's AUROCs with CIs (score-tokens)
    control_arrays(tokenizer, records, max_doc_tokens, max_response_tokens) -> the controls alone, no model
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from ...data.encode import IGNORE, encode_record
from ...data.records import Record
from ...foundations.metrics import auroc, weighted_aurocs
from ...inference.token_scores import TokenScores
from ..lexical import CONTROLS, labelled_controls

DETECTORS = ("head", "frozen probe", "surprisal", *CONTROLS)
# the row of a paired table of two heads (reproduce_tables.head_pairs) that a claim reads
MEAN_OF_SETS = "mean over CLIFF's sets"


class AurocCI(NamedTuple):
    auroc: float
    ci_low: float
    ci_high: float


def record_weights(groups: np.ndarray, n: int, seed: int) -> np.ndarray:
    """`n` cluster-bootstrap resamples as token weights (n, tokens): whole groups (records) drawn with replacement,
    each token weighted by how often its record was drawn."""
    ids, inverse = np.unique(np.asarray(groups), return_inverse=True)
    if not n or not len(ids):
        return np.zeros((n, len(inverse)))
    picks = np.random.default_rng(seed).integers(0, len(ids), size=(n, len(ids)))
    counts = np.stack([np.bincount(p, minlength=len(ids)) for p in picks])
    return counts[:, inverse]


def bootstrap_auroc(
    bad: np.ndarray, scores: Mapping[str, np.ndarray], groups: np.ndarray, n: int = 1000, seed: int = 0
) -> dict[str, AurocCI]:
    """AUROC of each score for the positives `bad`, with a 95% percentile CI from `n` cluster-bootstrap resamples
    (record_weights), the same draws for every score. Resamples holding one class only are dropped; the CI is NaN
    when n = 0 or no resample holds both classes."""
    bad = np.asarray(bad).astype(int)
    weights = record_weights(groups, n, seed)
    out = {}
    for name, s in scores.items():
        s = np.asarray(s, dtype=np.float64)
        boot = weighted_aurocs(bad, s, weights) if n and len(bad) else np.zeros(0)
        boot = boot[~np.isnan(boot)]
        lo, hi = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
        out[name] = AurocCI(auroc(bad, s), float(lo), float(hi))
    return out


def paired_auroc_draws(
    bad: np.ndarray, a: np.ndarray, b: np.ndarray, groups: np.ndarray, n: int = 2000, seed: int = 0
) -> tuple[float, np.ndarray]:
    """AUROC(a) − AUROC(b) on the same labelled tokens, and the difference in each of `n` record resamples, the same
    records drawn for both (a paired bootstrap: what the two detectors share cancels; NaN for a resample holding one
    class only)."""
    bad, weights = np.asarray(bad).astype(int), record_weights(groups, n, seed)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    draws = weighted_aurocs(bad, a, weights) - weighted_aurocs(bad, b, weights) if n and len(bad) else np.zeros(0)
    return auroc(bad, a) - auroc(bad, b), draws


def token_arrays(records: Sequence[Record], scores: Sequence[TokenScores]) -> dict[str, np.ndarray]:
    """The labelled tokens of `records` scored (`scores`, one per record): record index, bad (1) / good (0), and
    each detector's score — the head, the frozen probe where it was scored, surprisal and every control."""
    record = np.concatenate([np.full(len(s.gold), i) for i, s in enumerate(scores)])
    gold = np.concatenate([s.gold for s in scores])
    keep = gold != IGNORE
    base = [s.p_good_base for s in scores]
    return {
        "record": record[keep],
        "bad": (gold[keep] == 0).astype(np.int64),
        "head": np.concatenate([1 - s.p_good for s in scores])[keep],
        **({"frozen probe": np.concatenate([1 - b for b in base])[keep]} if all(b is not None for b in base) else {}),
        "surprisal": np.concatenate([s.surprisal for s in scores])[keep],
        **labelled_controls(
            [r.document for r in records],
            [s.response for s in scores],
            [s.offsets for s in scores],
            [s.gold for s in scores],
        ),
    }


def control_arrays(
    tokenizer, records: Sequence[Record], max_doc_tokens: int | None, max_response_tokens: int | None
) -> dict[str, np.ndarray]:
    """The model-free controls on the labelled tokens of `records` as the scorer encodes them (the base model's
    tokenizer, the adapter's document and response caps), without any model: record index, bad, each control."""
    encoded = [encode_record(tokenizer, r, max_doc_tokens, max_response_tokens) for r in records]
    gold = [e.response_labels for e in encoded]
    controls = labelled_controls(
        [r.document for r in records], [r.response for r in records], [e.response_offsets for e in encoded], gold
    )
    return {
        "record": np.concatenate([np.full(int((g != IGNORE).sum()), i) for i, g in enumerate(gold)]),
        "bad": np.concatenate([(g[g != IGNORE] == 0) for g in gold]).astype(np.int64),
        **controls,
    }


def detection_summary(
    records: Sequence[Record], scores: Sequence[TokenScores], bootstrap: int = 1000, seed: int = 0
) -> dict:
    """One token set's detection figures (score-tokens' table): tokens, % bad and, per detector present (head,
    frozen probe, surprisal, every control), its AUROC with the record-bootstrap 95% CI, as {detector: AurocCI}."""
    t = token_arrays(records, scores)
    detectors = [d for d in DETECTORS if d in t]
    n = len(t["bad"])
    return {
        "tokens": n,
        "records": len(records),
        "pct_bad": float(100 * t["bad"].mean()) if n else float("nan"),
        "aurocs": bootstrap_auroc(t["bad"], {d: t[d] for d in detectors}, t["record"], bootstrap, seed),
    }
