"""A data set at a glance, as the Data page and `data stats` show it: its counts, the records a browse filter keeps, a
record's response tokens with their gold labels, and its token labels under every label setting."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .encode import encode_record
from .label_settings import label_settings_table
from .records import Record
from .split import split_records

ALL = "all"  # every split


@dataclass(frozen=True)
class Counts:
    records: int
    documents: int
    token_labelled_pct: float  # of the records, those with token labels
    unfaithful: int  # records with sequence label 0


def counts(records: Sequence[Record]) -> Counts:
    labelled = sum(r.token_labels_known for r in records)
    return Counts(
        len(records),
        len({r.doc_id for r in records}),
        100 * labelled / max(1, len(records)),
        sum(r.sequence_label == 0 for r in records),
    )


def of_split(records: Sequence[Record], split: str) -> list[Record]:
    """The records of `split` (train, val, test: by document, as training splits them), or every one for ALL."""
    return list(records) if split == ALL else split_records(records)[split]


def browse(records: Sequence[Record], split: str, sources: Collection[str], only_bad: bool) -> list[Record]:
    """The records of `split` from `sources`, only those with bad spans when `only_bad`."""
    return [r for r in of_split(records, split) if r.source in sources and (r.bad_spans or not only_bad)]


def response_tokens(tokenizer, record: Record, max_tokens: int = 512) -> tuple[list[str], np.ndarray | None]:
    """The record's response as `tokenizer`'s tokens (the first max_tokens) and their gold labels (1 good, 0 bad,
    -1 not supervised); None for a record with a sequence label only."""
    e = encode_record(tokenizer, record, max_response_tokens=max_tokens)
    tokens = [record.response[s:t] for s, t in e.response_offsets]
    return tokens, e.response_labels if record.token_labels_known else None


def token_labelled(records: Sequence[Record], split: str = ALL, limit: int | None = None) -> list[Record]:
    """The first `limit` (None: every) token-labelled records of `split`."""
    return [r for r in of_split(records, split) if r.token_labels_known][:limit]


def label_settings(
    tokenizer, records: Sequence[Record], seed: int, progress: Callable[[int, int], None] | None = None
) -> pd.DataFrame:
    """variants.label_settings_table over the response labels of `records` on `tokenizer`'s tokens (an empty table
    for no records), reporting progress(done, total) per record."""
    labels = []
    for r in records:
        labels.append(encode_record(tokenizer, r).response_labels)
        if progress is not None:
            progress(len(labels), len(records))
    return label_settings_table(labels, seed=seed) if labels else pd.DataFrame()
