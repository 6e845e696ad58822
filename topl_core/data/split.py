"""Document-level train/val/test split: all records of one document land in the same split."""

from __future__ import annotations

import hashlib
from typing import Sequence

from ..foundations.errors import DataError
from .records import Record

SPLITS = ("train", "val", "test")


def split_of(doc_id: str, fractions: tuple[float, float, float], seed: int) -> str:
    """Stable split for a document id (a hash, so adding documents never moves existing ones)."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()[:8], "big") / 2**64
    if h < fractions[0]:
        return "train"
    if h < fractions[0] + fractions[1]:
        return "val"
    return "test"


def split_records(
    records: Sequence[Record], fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, list[Record]]:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise DataError(
            f"split fractions={fractions!r} must be three non-negative numbers summing to 1 (train, val, test)."
        )
    out: dict[str, list[Record]] = {s: [] for s in SPLITS}
    for r in records:
        out[split_of(r.doc_id, fractions, seed)].append(r)
    return out


def first_documents(records: Sequence[Record], n: int) -> list[Record]:
    """One record per document — the first — for the first n distinct documents, in order (evaluation and sweep
    generation pick their documents this way)."""
    out, seen = [], set()
    for r in records:
        if len(out) >= n:
            break
        if r.doc_id not in seen:
            seen.add(r.doc_id)
            out.append(r)
    return out
