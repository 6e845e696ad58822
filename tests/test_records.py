"""The record type's JSONL import/export and its errors."""

from __future__ import annotations

import json

import pytest

from topl_core.data.records import read_jsonl, write_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.errors import DataError


def test_jsonl_round_trip_is_exact(tmp_path, tiny_records):
    path = write_jsonl(tiny_records, tmp_path / "r.jsonl")
    assert read_jsonl(path) == tiny_records
    assert [r.meta for r in read_jsonl(path)] == [r.meta for r in tiny_records]


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('{"id": "a", "document": "d"}', "missing field"),
        ('{"id": "a", "document": "d", "response": "r", "colour": 1}', "unknown field"),
        ('{"id": "a", "document": "d", "response": "r", "bad_spans": [{"start": 0}]}', "bad_spans"),
        ('{"id": "a", "document": "d", "response": "r", "sequence_label": 3}', "sequence_label"),
    ],
)
def test_malformed_rows_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "ok", "document": "d", "response": "r"}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=message) as e:
        read_jsonl(path)
    assert "bad.jsonl:2" in str(e.value)


def test_no_records_never_replace_a_data_set(tmp_path, tiny_records):
    path = write_jsonl(tiny_records, tmp_path / "r.jsonl")
    before = path.read_bytes()
    with pytest.raises(DataError, match="left as it was"):
        write_jsonl([], path)
    assert path.read_bytes() == before
    with pytest.raises(DataError, match="not written"):
        write_jsonl(iter(()), tmp_path / "new.jsonl")
    assert not (tmp_path / "new.jsonl").exists()


def test_missing_file_says_how_to_build(tmp_path):
    with pytest.raises(DataError, match="data build"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_split_is_by_document_and_stable(tiny_records):
    s1 = split_records(tiny_records, seed=0)
    assert sum(map(len, s1.values())) == len(tiny_records)
    docs = {k: {r.doc_id for r in v} for k, v in s1.items()}
    assert not (docs["train"] & docs["val"]) and not (docs["train"] & docs["test"]) and not (docs["val"] & docs["test"])
    # adding records never moves existing documents
    s2 = split_records(tiny_records[:20], seed=0)
    for k in s2:
        assert {r.id for r in s2[k]} <= {r.id for r in s1[k]}
    with pytest.raises(DataError, match="fractions"):
        split_records(tiny_records, fractions=(0.5, 0.5, 0.5))
