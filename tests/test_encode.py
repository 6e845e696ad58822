"""Records → tokens: prompts, offset-based token labels, truncation, batching."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_smollm2

from topl_core.data.encode import (
    IGNORE,
    build_prompt,
    collate,
    encode_record,
    token_labels_from_offsets,
    truncate_document,
)
from topl_core.data.records import Record, Span
from topl_core.models.loading import load_model


def _check_exact_labels(tok, record: Record) -> None:
    """Every token covering a non-space character of an edited span is bad; every other token is good."""
    e = encode_record(tok, record, max_response_tokens=10_000)
    bad_chars = set()
    for s in record.bad_spans:
        bad_chars |= {i for i in range(s.start, s.end) if not record.response[i].isspace()}
    for (a, b), lab in zip(e.response_offsets, e.response_labels):
        assert lab == (0 if bad_chars & set(range(a, b)) else 1)
    # the bad tokens cover every bad character
    covered = {i for (a, b), lab in zip(e.response_offsets, e.response_labels) if lab == 0 for i in range(a, b)}
    assert bad_chars <= covered


def test_perturbation_labels_are_exact_tiny(tiny_records):
    tok = load_model("tiny-llama").tokenizer
    for r in tiny_records:
        _check_exact_labels(tok, r)


@needs_smollm2
def test_perturbation_labels_are_exact_smollm2():
    from topl_core.data.halueval import halueval_perturbation_records, load_halueval_rows

    tok = load_model("smollm2-135m").tokenizer
    records = halueval_perturbation_records(load_halueval_rows(limit=60), seed=3)
    assert sum(r.sequence_label == 0 for r in records) == 60
    v2 = halueval_perturbation_records(load_halueval_rows(limit=200), seed=3, recipe="v2")
    kinds = {s.kind for r in v2 for s in r.bad_spans}
    assert {"attribution", "swap", "extrinsic", "modal", "copied"} <= kinds  # every v2 kind is checked below
    for r in records + v2:
        _check_exact_labels(tok, r)


def test_leading_space_is_not_bad():
    # " Paris" covers the space before a bad span that starts at "P": only "Paris" is bad, not the word before it
    response = "He went to Paris."
    offsets = np.array([[0, 2], [2, 7], [7, 10], [10, 16], [16, 17]])
    bad = np.zeros(len(response), bool)
    bad[10:16] = True  # " Paris" including the leading space
    labels = token_labels_from_offsets(response, bad, offsets)
    assert labels.tolist() == [1, 1, 1, 0, 1]
    bad[:] = False
    bad[10] = True  # only the space is marked: no token is bad
    assert token_labels_from_offsets(response, bad, offsets).tolist() == [1] * 5


def test_prompt_and_document_are_not_supervised(tiny_records):
    tok = load_model("tiny-llama").tokenizer
    e = encode_record(tok, tiny_records[1])
    assert (e.labels[: e.response_start] == IGNORE).all()
    assert (e.labels[e.response_end :] == IGNORE).all()  # end-of-turn
    assert set(e.response_labels.tolist()) <= {0, 1}
    assert (
        tok.decode(e.input_ids[e.response_start : e.response_end]).strip()
        == tiny_records[1].response[: e.response_offsets[-1][1]].strip()
    )


def test_chat_template_used_when_present_else_plain_prompt():
    chat = build_prompt(load_model("tiny-llama").tokenizer, "Doc text.")
    plain = build_prompt(load_model("tiny-gemma3").tokenizer, "Doc text.")
    assert chat.startswith("<|im_start|>user") and chat.endswith("<|im_start|>assistant\n")
    assert plain.startswith("<bos>") and plain.endswith("Summary:\n") and "Doc text." in plain


def test_sequence_only_records_have_no_token_labels():
    tok = load_model("tiny-llama").tokenizer
    r = Record(
        id="x", document="A doc.", response="A hallucinated rewrite.", token_labels_known=False, sequence_label=0
    )
    assert (encode_record(tok, r).labels == IGNORE).all()


def test_document_truncation_respects_token_budget(tiny_records):
    tok = load_model("tiny-llama").tokenizer
    long = Record(id="l", document=" ".join([tiny_records[0].document] * 20), response="Short.")
    full = encode_record(tok, long, max_doc_tokens=None)
    cut = encode_record(tok, long, max_doc_tokens=50)
    assert len(cut) < len(full)
    doc_tokens = len(tok(long.document, add_special_tokens=False)["input_ids"])
    assert len(full) - len(cut) == pytest.approx(doc_tokens - 50, abs=2)


def test_huge_inputs_are_cut_before_tokenizing(tiny_records):
    """A huge document or response is tokenized only up to a window bounded by the token limit, and the kept tokens
    are those of the whole text."""
    tok = load_model("tiny-llama").tokenizer
    seen: list[int] = []

    class Counting:  # the tokenizer, recording how many characters it is asked to tokenize
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, text, **kw):
            seen.append(len(text))
            return tok(text, **kw)

    huge = Record(id="h", document=tiny_records[0].document * 5_000, response=tiny_records[0].response * 2_000)
    assert len(huge.document) > 900_000
    encoded = encode_record(Counting(), huge, max_doc_tokens=64, max_response_tokens=32)
    assert max(seen) < 100_000
    whole_doc = tok(huge.document[:200_000], add_special_tokens=False, return_offsets_mapping=True)
    assert truncate_document(tok, huge.document, 64) == huge.document[: whole_doc["offset_mapping"][63][1]]
    whole_response = tok(huge.response[:50_000], add_special_tokens=False)["input_ids"][:32]
    assert encoded.input_ids[encoded.response_start : encoded.response_end].tolist() == whole_response


def test_collate_pads_and_masks(tiny_records):
    tok = load_model("tiny-llama").tokenizer
    ex = [encode_record(tok, r) for r in tiny_records[:3]]
    b = collate(ex, tok.pad_token_id)
    assert b.input_ids.shape[1] % 16 == 0 and b.input_ids.shape[1] >= max(len(e) for e in ex)
    for i, e in enumerate(ex):
        assert b.attention_mask[i].sum() == len(e)
        assert b.response_mask[i].sum() == e.response_end - e.response_start
    assert b.sequence_labels.tolist() == [r.sequence_label for r in tiny_records[:3]]


def test_bad_span_outside_response_rejected():
    from topl_core.foundations.errors import DataError

    with pytest.raises(DataError, match="outside the response"):
        Record(id="x", document="d", response="short", bad_spans=(Span(2, 40, "entity"),))
    with pytest.raises(DataError, match="empty document"):
        Record(id="x", document=" ", response="short")
    with pytest.raises(DataError, match="empty response"):
        Record(id="x", document="doc", response="")
