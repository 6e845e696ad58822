import ast
import re
from pathlib import Path

import pandas as pd
import pytest

from topl_core.data.cliff import load_factuality_csv, match_spans
from topl_core.data.encode import encode_record
from topl_core.data.records import Record, Span
from topl_core.data.textform import detokenize
from topl_core.foundations.errors import DataError
from topl_core.models.loading import load_model

CLIFF_CSV = Path(__file__).parents[2] / "shared/data/CLIFF_error_types.csv"


def test_match_spans_prefers_unused_occurrences_and_normalises_whitespace_and_case():
    text = "Julian Zelizer: pay cut. Zelizer says it is a (656 ft) stunt."
    spans, missing = match_spans(text, ["Julian Zelizer:", "Zelizer", "( 656 FT)", "", "absent"])
    assert missing == ["absent"]
    assert [text[s.start : s.end] for s in spans] == ["Julian Zelizer:", "Zelizer", "(656 ft)"]
    assert spans[1].start == text.index("Zelizer says")
    # When every occurrence overlaps an earlier span, the first occurrence is used.
    spans, _ = match_spans("Lee Westwood won.", ["Lee Westwood", "Westwood"])
    assert [(s.start, s.end) for s in spans] == [(0, 12), (4, 12)]


def write_csv(path, rows):
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def span_row(summ, spans, **extra):
    return {
        "dataset": "CLIFF",
        "origin": "xsum",
        "id": "7",
        "doc": "A document.",
        "summ": summ,
        "model_name": "BART",
        "cut": "val",
        "error_type": "x",
        "annotated_span": repr(spans) if spans else "",
        **extra,
    }


def test_span_csv_skips_or_raises_on_missing_spans(tmp_path):
    path = write_csv(
        tmp_path / "c.csv", [span_row("A cat sat.", ["cat"]), span_row("A dog ran.", ["cow"]), span_row("Fine.", [])]
    )
    report = load_factuality_csv(path)
    assert report.rows_read == 3 and len(report.records) == 2 and report.token_level
    assert [(s.row, s.reason) for s in report.skipped] == [(1, "annotated span(s) ['cow'] not found in the summary")]
    bad, good = report.records
    assert bad.bad_texts == ["cat"] and bad.sequence_label == 0 and good.sequence_label == 1 and good.bad_spans == ()
    assert bad.source == "cliff-xsum" and bad.doc_id == "xsum-7" and bad.id == "cliff-xsum:0"
    assert bad.meta == {"dataset": "CLIFF", "model_name": "BART", "error_type": "x", "cut": "val"}
    assert "row 1: annotated span(s) ['cow']" in str(report)
    with pytest.raises(DataError, match=r"row 1: annotated span\(s\) \['cow'\] not found"):
        load_factuality_csv(path, on_missing="raise")


def test_every_shape_of_aggrefact_span_annotations_loads(tmp_path):
    """Hand-written rows of the shapes AggreFact's error-type CSVs use: a flat list, one list per error type
    (aligned with a list-valued error_type), annotator notes instead of quotes (alone, or beside found spans),
    several spans abbreviated in one string, a typo'd one-word quote, a correct summary."""
    rows = [
        span_row("The capital is Lyon.", ["Lyon"]),
        span_row(
            "The capital is Lyon since 1990.",
            [["Lyon"], ["since 1990"]],
            error_type="['extrinsic-NP', 'intrinsic-predicate']",
        ),
        span_row("He was paid well.", ["[really bad overall]"]),
        span_row("The capital is Lyon.", ["missing entity", "Lyon"]),
        span_row("Smith met Jones in Leeds in 2010.", ["Smith; Jones", "Leeds ... 2010"]),
        span_row("The capital is Lyon.", ["Lyonn"]),
        span_row("Fine.", []),
    ]
    report = load_factuality_csv(write_csv(tmp_path / "shapes.csv", rows))
    flat, nested, note_only, partial, abbreviated, correct = report.records
    assert flat.bad_texts == ["Lyon"] and [s.kind for s in flat.bad_spans] == ["error"]
    assert nested.bad_texts == ["Lyon", "since 1990"]
    assert [s.kind for s in nested.bad_spans] == ["extrinsic-NP", "intrinsic-predicate"]
    assert not note_only.token_labels_known and note_only.sequence_label == 0 and not note_only.bad_spans
    assert note_only.meta["annotator_notes"] == ["[really bad overall]"]
    assert partial.bad_texts == ["Lyon"] and partial.meta["annotator_notes"] == ["missing entity"]
    assert abbreviated.bad_texts == ["Smith", "Jones", "Leeds", "2010"]
    assert correct.sequence_label == 1 and correct.token_labels_known and not correct.bad_spans
    assert [(s.row, s.reason) for s in report.skipped] == [(5, "annotated span(s) ['Lyonn'] not found in the summary")]
    assert report.spans == {
        "spans found": 8,
        "annotator notes skipped": 2,
        "rows kept as summary-level (notes only)": 1,
        "rows partial (notes beside found spans)": 1,
        "abbreviated annotations split into their spans": 2,
        "spans dropped with their row": 1,
    }
    assert "annotator notes skipped: 2" in str(report)
    broken = write_csv(tmp_path / "broken.csv", [span_row("A cat.", [["cat"], "dog"])])
    with pytest.raises(DataError, match="row 0, column annotated_span: expected a list of strings or a list of lists"):
        load_factuality_csv(broken)


def test_span_csv_structural_errors(tmp_path):
    with pytest.raises(DataError, match=r"row 0, column annotated_span: .* not a Python list"):
        load_factuality_csv(write_csv(tmp_path / "a.csv", [span_row("A cat.", None, annotated_span="['cat'")]))
    with pytest.raises(DataError, match=r"missing column\(s\) \['summ'\]"):
        load_factuality_csv(write_csv(tmp_path / "b.csv", [{"doc": "d", "annotated_span": ""}]))
    with pytest.raises(DataError, match="CSV not found"):
        load_factuality_csv(tmp_path / "absent.csv")


def test_label_csv_is_sequence_level(tmp_path):
    rows = [
        {"origin": "cnndm", "id": "1", "doc": "Doc.", "summ": "S one.", "label": "1"},
        {"origin": "cnndm", "id": "2", "doc": "Doc.", "summ": "S two.", "label": "0"},
    ]
    report = load_factuality_csv(write_csv(tmp_path / "agg.csv", rows))
    assert not report.token_level and report.sources == {"aggrefact-cnndm": 2}
    assert [r.sequence_label for r in report.records] == [1, 0]
    assert not any(r.token_labels_known for r in report.records)
    with pytest.raises(DataError, match=r"row 0, column label: 'yes' must be 1"):
        load_factuality_csv(write_csv(tmp_path / "bad.csv", [{**rows[0], "label": "yes"}]))


@pytest.mark.skipif(
    not CLIFF_CSV.is_file(), reason=f"{CLIFF_CSV} is not present (it lives in shared/, outside the repo)"
)
def test_real_cliff_csv():
    report = load_factuality_csv(CLIFF_CSV)
    table = pd.read_csv(CLIFF_CSV, dtype=str, keep_default_na=False)
    assert report.rows_read == len(table) == 600
    assert len(report.records) + len(report.skipped) == 600
    assert set(report.sources) == {"cliff-xsum", "cliff-cnndm"}
    by_row = {int(r.id.split(":")[1]): r for r in report.records}
    for row, record in by_row.items():
        annotated = [s for s in ast.literal_eval(table.annotated_span[row] or "[]") if s.strip()]
        assert len(record.bad_spans) == len(annotated)
        assert record.sequence_label == (0 if annotated else 1)
        assert (table.error_type[row] == "correct") == (not annotated)
        for text in record.bad_texts:
            assert "".join(text.split()).lower() in ["".join(a.split()).lower() for a in annotated]


def test_detokenize_rewrites_ptb_forms():
    old = "the 30 - year - old -lrb- pictured -rrb- said he `` did n't '' know it 's $ 5 , police said ."
    assert detokenize(old).text == "the 30-year-old (pictured) said he \" didn't \" know it's $5, police said."
    assert detokenize('An ordinary sentence (with brackets), quotes "here" and a well-known fact.').text == (
        'An ordinary sentence (with brackets), quotes "here" and a well-known fact.'
    )


def test_detokenize_moves_every_word_span_exactly():
    """Any span from the start of one word token to the end of another lands on the detokenized text of that span."""
    old = "the 30 - year - old -lrb- pictured -rrb- did n't say , `` we 're fine '' ; it cost $ 5 ."
    rewritten = detokenize(old)
    words = [(m.start(), m.end()) for m in re.finditer(r"(?<!\S)[\w$][\w']*(?!\S)", old)]  # whole tokens
    for i, (start, _) in enumerate(words):
        for _, end in words[i:]:
            moved = rewritten.span(Span(start, end))
            assert rewritten.text[moved.start : moved.end] == detokenize(old[start:end]).text, old[start:end]


def test_detokenized_labels_are_exact_token_by_token():
    """Encoded with a tokenizer, the detokenized record labels bad exactly the tokens of the moved span."""
    old = "Obraniak , 30 , was taken to hospital -lrb- in Rize -rrb- after the 5 - 1 win ."
    rewritten = detokenize(old)
    span = rewritten.span(Span(old.index("in Rize"), old.index("in Rize") + len("in Rize")))
    record = Record(id="r", document="doc text", response=rewritten.text, bad_spans=(span,))
    assert record.bad_texts == ["in Rize"] and rewritten.text.endswith("(in Rize) after the 5-1 win.")
    tok = load_model("tiny-llama").tokenizer
    encoded = encode_record(tok, record, None, None)
    bad_chars = {i for i in range(span.start, span.end) if not rewritten.text[i].isspace()}
    for (a, b), label in zip(encoded.response_offsets, encoded.response_labels):
        assert label == (0 if bad_chars & set(range(a, b)) else 1), rewritten.text[a:b]
    bad = [(a, b) for (a, b), label in zip(encoded.response_offsets, encoded.response_labels) if label == 0]
    assert rewritten.text[bad[0][0] : bad[-1][1]].strip() == "in Rize"


@pytest.mark.skipif(
    not CLIFF_CSV.is_file(), reason=f"{CLIFF_CSV} is not present (it lives in shared/, outside the repo)"
)
def test_real_cliff_csv_detokenized():
    plain = load_factuality_csv(CLIFF_CSV)
    report = load_factuality_csv(CLIFF_CSV, detokenized=True)
    assert [r.id for r in report.records] == [r.id for r in plain.records]
    spaced = re.compile(r"\w - \w")
    assert sum(bool(spaced.search(r.response)) for r in plain.records) > 100
    assert not any(spaced.search(r.response) or spaced.search(r.document) for r in report.records)
    for before, after in zip(plain.records, report.records):
        assert after.meta["text_form"] == "detokenized" and len(after.bad_spans) == len(before.bad_spans)
        for old, new in zip(before.bad_texts, after.bad_texts):
            assert new == detokenize(old).text.strip() or new in detokenize(old).text
