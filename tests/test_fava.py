import pytest

from topl_core.data.fava import fava_records, parse_fava
from topl_core.foundations.errors import DataError

RAW = (
    "Lionel Messi is an <entity><mark>Brazilian</mark><delete>Argentine</delete></entity> footballer who "
    "<relation><mark>left</mark><delete>joined</delete></relation> Inter Miami in 2023. "
    "<invented>He also owns a chain of bakeries in Rosario.</invented> He is widely regarded as "
    "<subjective>the most boring player of all time</subjective>."
)
COMPLETION = (
    "Lionel Messi is an <entity><delete>Brazilian</delete><mark>Argentine</mark></entity> footballer who "
    "<relation><delete>left</delete><mark>joined</mark></relation> Inter Miami in 2023. "
    "<invented><delete>He also owns a chain of bakeries in Rosario.</delete></invented> He is widely regarded as "
    "<subjective>the most boring player of all time</subjective>."
)
EXPECTED_TEXT = (
    "Lionel Messi is an Brazilian footballer who left Inter Miami in 2023. He also owns a chain of bakeries in "
    "Rosario. He is widely regarded as the most boring player of all time."
)
EXPECTED_SPANS = [
    ("Brazilian", "entity"),
    ("left", "relation"),
    ("He also owns a chain of bakeries in Rosario.", "invented"),
    ("the most boring player of all time", "subjective"),
]


@pytest.mark.parametrize("text, form", [(RAW, "raw"), (COMPLETION, "completion")])
def test_both_forms_give_the_same_text_and_spans(text, form):
    perturbed, spans = parse_fava(text, form)
    assert perturbed == EXPECTED_TEXT
    assert [(perturbed[s.start : s.end], s.kind) for s in spans] == EXPECTED_SPANS


def test_whitespace_is_trimmed_and_bare_edit_tags_and_untagged_text():
    perturbed, spans = parse_fava(
        "A <contradictory> cat is a dog. </contradictory>B <mark>x</mark><delete>y</delete>.", "raw"
    )
    assert perturbed == "A  cat is a dog. B x."
    assert [(perturbed[s.start : s.end], s.kind) for s in spans] == [("cat is a dog.", "contradictory"), ("x", "error")]
    assert parse_fava("Nothing wrong here.", "completion") == ("Nothing wrong here.", ())
    # An entity whose only content is the removed text leaves no span.
    assert parse_fava("Paris<entity><delete> France</delete></entity>.", "raw") == ("Paris.", ())


@pytest.mark.parametrize(
    "text, message",
    [
        ("a <entity><mark>b</mark> c", r"<entity> opened at character 2 is never closed"),
        ("a <mark>b</delete>", r"</delete> at character 9 does not match <mark> opened at character 2"),
        ("a </invented>", r"</invented> at character 2 closes a tag that was never opened"),
        ("<entity>a <invented>b</invented></entity>", r"<invented> at character 10 is nested inside <entity>"),
        ("<entity><mark>a <delete>b</delete></mark></entity>", r"<delete> at character 16 is nested inside <mark>"),
        ("a <b>bold</b>", r"unknown tag <b> at character 2"),
    ],
)
def test_malformed_tags_raise_with_position(text, message):
    with pytest.raises(DataError, match=message):
        parse_fava(text, "raw")


def test_unknown_form():
    with pytest.raises(DataError, match="form='edited'"):
        parse_fava("x", "edited")


def test_fava_records():
    rows = [
        {"id": "q1", "evidence": "Messi is an Argentine footballer.", "errored_passage": RAW},
        {"document": "A doc.", "errored_passage": "All good."},
    ]
    first, second = fava_records(rows, "raw")
    assert first.id == "q1" and first.sequence_label == 0 and first.response == EXPECTED_TEXT
    assert first.bad_texts == [t for t, _ in EXPECTED_SPANS] and first.source == "fava"
    assert second.id == "fava-1" and second.sequence_label == 1 and second.bad_spans == ()
    completion_rows = [{"evidence": "Messi is an Argentine footballer.", "completion": COMPLETION}]
    assert fava_records(completion_rows, "completion")[0].bad_spans == first.bad_spans


def test_fava_records_errors_name_the_row():
    with pytest.raises(DataError, match=r"fava row 0: needs a document .* keys \['errored_passage'\]"):
        fava_records([{"errored_passage": "x"}], "raw")
    with pytest.raises(DataError, match=r"fava row 1, field 'completion': <mark> opened at character 0"):
        fava_records([{"document": "d", "completion": "ok"}, {"document": "d", "completion": "<mark>x"}], "completion")
