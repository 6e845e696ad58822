"""Token scoring: a TOPL-style adapter + head over (document, response) → per-token p(good), with token text and
character offsets for colored overlays; the base model's token surprisal as a baseline detector; and, optionally, a
probe head on the base model's own hidden states (the frozen-probe control) on the same tokens."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..data.encode import IGNORE, Encoded, collate, encode_record
from ..data.records import Record
from ..foundations.errors import RunError
from ..foundations.metrics import auroc
from ..hardware.precision import autocast, resolve_precision, to_numpy
from ..models.forward import head_features, head_probability, next_token_logprobs
from ..models.loading import LoadedModel
from ..training.adapters import load_adapter, open_adapter


@dataclass(frozen=True)
class TokenScores:
    """Per-response-token values. `gold` is 1 good / 0 bad / -1 unknown.

    Example: ``scores.table()`` (one row per token); ``TokenOverlay.from_scores(scores)`` shows them coloured"""

    record_id: str
    response: str
    offsets: np.ndarray  # (n, 2) character offsets into response
    p_good: np.ndarray  # (n,) head probability that the token is faithful
    surprisal: np.ndarray  # (n,) base-model −log p(token | prefix), nats
    gold: np.ndarray  # (n,)
    p_good_base: np.ndarray | None = None  # (n,) the probe_on_base head on the base model's states; None without one

    @property
    def tokens(self) -> list[str]:
        return [self.response[s:e] for s, e in self.offsets]

    def table(self, threshold: float = 0.5):
        """One row per token: position, token, p_good, surprisal, gold ("good" / "bad" / "" unknown) and flagged
        (p(good) < threshold)."""
        import pandas as pd

        gold = np.where(self.gold == 1, "good", np.where(self.gold == 0, "bad", ""))
        return pd.DataFrame(
            {
                "position": np.arange(len(self.p_good)),
                "token": self.tokens,
                "p_good": self.p_good.astype(float),
                "surprisal": self.surprisal.astype(float),
                "gold": gold,
                "flagged": self.p_good < threshold,
            }
        )

    def flags(self, threshold: float = 0.5) -> "FlagSummary":
        """What flagging p(good) < threshold finds, against the gold labels where they are known."""
        flagged = self.p_good < threshold
        known = self.gold >= 0
        if not known.any():
            return FlagSummary(len(self.p_good), int(flagged.sum()), float(self.p_good.mean()))
        bad = (self.gold[known] == 0).astype(int)
        hits = int((flagged[known] & (bad == 1)).sum())
        return FlagSummary(
            len(self.p_good),
            int(flagged.sum()),
            float(self.p_good.mean()),
            gold_bad=int(bad.sum()),
            precision=hits / max(1, int(flagged[known].sum())),
            recall=hits / max(1, int(bad.sum())),
            head_auroc=auroc(bad, 1 - self.p_good[known]),
            surprisal_auroc=auroc(bad, self.surprisal[known]),
        )


@dataclass(frozen=True)
class FlagSummary:
    """TokenScores.flags: the tokens, how many are flagged, their mean p(good); with gold labels, the gold-bad count,
    the flags' precision and recall and the AUROC of flagging bad tokens by the head (1 − p(good)) and by the base
    model's surprisal (None without gold labels)."""

    tokens: int
    flagged: int
    mean_p_good: float
    gold_bad: int | None = None
    precision: float | None = None
    recall: float | None = None
    head_auroc: float | None = None
    surprisal_auroc: float | None = None


class TokenScorer:
    """Loads an adapter (unmerged) and a head onto a base model it owns. Thread-safe: one forward at a time.

    The head is the run's trained head (TOPL, SOPL, TLDR), or `head` = (layer, nn.Linear) for an adapter without
    one — a probe head fitted on its hidden states (topl_core.analysis.lora_a.probe_head). `probe_on_base` = (layer,
    nn.Linear) also scores every token with a head on the base model's states (adapter disabled): the frozen-probe
    control, in TokenScores.p_good_base.

    Example: ``TokenScorer(load_model(adapter.base_model), adapter).score_text(document, summary).p_good``"""

    def __init__(
        self,
        base: LoadedModel,
        adapter,
        precision: str = "auto",
        max_doc_tokens: int | None = 512,
        max_response_tokens: int = 256,
        head: tuple[int, torch.nn.Linear] | None = None,
        probe_on_base: tuple[int, torch.nn.Linear] | None = None,
    ):
        self.adapter = open_adapter(adapter)
        if head is None and not self.adapter.has_head:
            raise RunError(
                f"{self.adapter.name} has no head (method: {self.adapter.method or 'unknown'}); token scores need "
                "one. Fit a probe head on its hidden states (Token overlay page, or score-tokens --probe-head)."
            )
        self.tokenizer = base.tokenizer
        self.model = load_adapter(base, self.adapter)
        if head is None:
            self.head_layer = int(self.adapter.head_layer)
            self.head = self.adapter.run.load_head(base.model.device)
        else:
            self.head_layer, self.head = head[0], head[1].to(base.model.device)
        self.probe_on_base = (
            None if probe_on_base is None else (probe_on_base[0], probe_on_base[1].to(base.model.device))
        )
        self.device = base.model.device.type
        self.precision = resolve_precision(precision, self.device)
        self.max_doc_tokens, self.max_response_tokens = max_doc_tokens, max_response_tokens
        self._lock = threading.Lock()

    def encode(self, records: Sequence[Record]) -> list[Encoded]:
        return [encode_record(self.tokenizer, r, self.max_doc_tokens, self.max_response_tokens) for r in records]

    @torch.no_grad()
    def score(self, records: Sequence[Record], batch_size: int = 8, progress=None) -> list[TokenScores]:
        """Per-token p(good) and base-model surprisal; `progress(done, total)` is called after each batch."""
        encoded = self.encode(records)
        out: list[TokenScores] = []
        with self._lock:
            for i in range(0, len(encoded), batch_size):
                chunk = encoded[i : i + batch_size]
                b = collate(chunk, self.tokenizer.pad_token_id).to(self.model.device)
                with autocast(self.precision, self.device):
                    p = head_probability(
                        self.head, head_features(self.model, b.input_ids, b.attention_mask, self.head_layer)
                    )
                    with self.model.disable_adapter():
                        lp = next_token_logprobs(self.model, b.input_ids, b.attention_mask, b.response_mask)
                        q = self._probe_on_base(b) if self.probe_on_base is not None else None
                p, s = to_numpy(p), to_numpy(-lp)
                q = to_numpy(q) if q is not None else None
                for j, e in enumerate(chunk):
                    sl = slice(e.response_start, e.response_end)
                    out.append(
                        TokenScores(
                            e.record_id,
                            records[i + j].response,
                            e.response_offsets,
                            p[j, sl],
                            s[j, sl],
                            e.response_labels,
                            q[j, sl] if q is not None else None,
                        )
                    )
                if progress is not None:
                    progress(len(out), len(encoded))
        return out

    def _probe_on_base(self, b) -> torch.Tensor:
        """p(good) of the probe_on_base head on the base model's states (called with the adapter disabled)."""
        layer, head = self.probe_on_base
        return head_probability(head, head_features(self.model, b.input_ids, b.attention_mask, layer))

    def score_text(self, document: str, response: str) -> TokenScores:
        return self.score([Record(id="input", document=document, response=response, token_labels_known=False)])[0]


def detection_auroc(scores: Sequence[TokenScores]) -> dict:
    """AUROC of flagging bad tokens: TOPL head (score 1 − p_good) vs base-model surprisal, on the same tokens."""
    gold = np.concatenate([s.gold for s in scores]) if scores else np.zeros(0)
    keep = gold != IGNORE
    bad = (gold[keep] == 0).astype(int)
    head = np.concatenate([1 - s.p_good for s in scores])[keep]
    surprisal = np.concatenate([s.surprisal for s in scores])[keep]
    return {
        "tokens": int(keep.sum()),
        "pct_bad": float(100 * bad.mean()) if len(bad) else float("nan"),
        "head_auroc": auroc(bad, head),
        "surprisal_auroc": auroc(bad, surprisal),
    }
