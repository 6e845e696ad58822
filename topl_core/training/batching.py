"""From records to batches: which records each method trains on, encoded (prompt + document + response, token labels
from character spans), and length-bucketed batches of single examples or (chosen, rejected) pairs, or packed
batches (several examples a row, no compute on padding)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..data.encode import Batch, Encoded, EncodedPair, collate, collate_packed, collate_pairs, encode_record
from ..data.records import Record


@dataclass(frozen=True)
class EncodeSettings:
    max_doc_tokens: int
    max_response_tokens: int


def encode_token_labelled(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    """Every record whose token labels are known, encoded with per-token labels."""
    return [
        encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens)
        for r in records
        if r.token_labels_known
    ]


def encode_all(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    """Every record (token labels where known, -1 elsewhere); its sequence label is what SOPL trains on."""
    return [encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens) for r in records]


def faithful_records(records: Sequence[Record]) -> list[Record]:
    """The faithful responses: records with sequence_label 1, plus the faithful_response of an unfaithful record
    whose document has no faithful record with that same text (each faithful text once per document)."""
    out, seen = [], set()
    for r in records:
        if r.sequence_label == 1 and (r.doc_id, r.response) not in seen:
            seen.add((r.doc_id, r.response))
            out.append(r)
    for r in records:
        if r.sequence_label == 0 and r.faithful_response and (r.doc_id, r.faithful_response) not in seen:
            seen.add((r.doc_id, r.faithful_response))
            out.append(_chosen_record(r))
    return out


def _chosen_record(r: Record) -> Record:
    return dataclasses.replace(
        r,
        id=f"{r.id}:faithful",
        response=r.faithful_response,
        bad_spans=(),
        token_labels_known=True,
        sequence_label=1,
        faithful_response=None,
        meta={},
    )


def encode_faithful(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    return [encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens) for r in faithful_records(records)]


def encode_pairs(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[EncodedPair]:
    """(chosen, rejected) for every unfaithful record with a faithful_response: the same document and prompt,
    chosen = faithful_response, rejected = the record's (perturbed or hallucinated) response."""
    return [
        EncodedPair(
            encode_record(tokenizer, _chosen_record(r), enc.max_doc_tokens, enc.max_response_tokens),
            encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens),
        )
        for r in records
        if r.sequence_label == 0 and r.faithful_response
    ]


def length_buckets(items: Sequence, size: int) -> list[list]:
    """Items sorted by length, then chunked by `size`: little padding and a few repeated shapes."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    return [[items[i] for i in order[k : k + size]] for k in range(0, len(order), size)]


def make_batches(examples: Sequence[Encoded], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-bucketed batches of `batch_size` examples."""
    return [collate(group, pad_id) for group in length_buckets(examples, batch_size)]


def make_pair_batches(pairs: Sequence[EncodedPair], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-bucketed pair batches of `batch_size` pairs (2 × batch_size rows: chosen, then rejected)."""
    return [collate_pairs(group, pad_id) for group in length_buckets(pairs, batch_size)]


def pack_rows(examples: Sequence[Encoded], capacity: int) -> list[list[Encoded]]:
    """First-fit decreasing: the examples, longest first, each into the first row with room for it (rows of at most
    `capacity` tokens; an example longer than that gets a row of its own)."""
    rows: list[list[Encoded]] = []
    room: list[int] = []
    for e in sorted(examples, key=len, reverse=True):
        fit = next((i for i, r in enumerate(room) if len(e) <= r), None)
        if fit is None:
            rows.append([e])
            room.append(capacity - len(e))
        else:
            rows[fit].append(e)
            room[fit] -= len(e)
    return rows


def make_packed_batches(examples: Sequence[Encoded], rows_per_batch: int, pad_id: int, pad_to_multiple: int = 16):
    """The examples packed into rows as long as the padded batch of them all would be (the longest example, rounded
    up to `pad_to_multiple`), `rows_per_batch` rows a batch: the same memory per batch as padded micro-batches of
    that many examples, fewer batches where short examples share a row. Only for losses that are means over tokens
    (a packed row is no example: its sequence labels are gone)."""
    capacity = -(-max(len(e) for e in examples) // pad_to_multiple) * pad_to_multiple
    rows = pack_rows(examples, capacity)
    return [
        collate_packed(rows[k : k + rows_per_batch], pad_id, pad_to_multiple)
        for k in range(0, len(rows), rows_per_batch)
    ]


def batch_for(batches: list, index: int, seed: int):
    """Batch number `index` of an endless stream of epochs, each a seeded permutation of the batches."""
    epoch, pos = divmod(index, len(batches))
    order = np.random.default_rng([seed, epoch]).permutation(len(batches))
    return batches[order[pos]]
