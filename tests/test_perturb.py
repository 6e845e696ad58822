import random
import re

import pytest

from topl_core.data.perturb import (
    EDIT_KINDS,
    Edit,
    apply_edits,
    build_perturbation_records,
    extract_names,
    perturb_summary,
)
from topl_core.data.records import Span
from topl_core.errors import DataError

DOCUMENT = (
    "Chelsea beat Arsenal 3-1 on Saturday at Stamford Bridge. Manager Jose Mourinho said the team was not at its best "
    "in March but has improved. Police arrested 12 fans after the match. Eden Hazard scored twice in 2015."
)
SUMMARY = (
    "Chelsea won against Arsenal on Saturday. Jose Mourinho said the team was not at its best in March. "
    "Police arrested 12 fans, and Eden Hazard is the top scorer since 2015."
)
DONORS = ("Manchester United signed Paul Pogba from Juventus in August.",)


def assert_exact_spans(original: str, perturbed: str, spans: tuple[Span, ...]) -> None:
    """The text of S' outside the spans is the text of S outside the edited regions (whitespace runs may differ by
    the single space that joins an insertion), and every span's text replaces different original text."""
    assert all(a.end < b.start for a, b in zip(spans, spans[1:])), "spans must be sorted and not touch"
    outside = [
        perturbed[a:b] for a, b in zip([0] + [s.end for s in spans], [s.start for s in spans] + [len(perturbed)])
    ]
    pattern = "(.*?)".join(re.sub(r"(\\ )+", r"\\s*", re.escape(piece)) for piece in outside)
    match = re.fullmatch(pattern, original, re.S)
    assert match, f"text outside the spans changed:\n{original}\n{perturbed}\n{spans}"
    for replaced, span in zip(match.groups(), spans):
        assert perturbed[span.start : span.end].strip() == perturbed[span.start : span.end]
        assert replaced != perturbed[span.start : span.end], f"span {span} did not change the text"


def test_apply_edits_shifts_later_spans():
    text = "He was at home in 2015."
    edits = [Edit(18, 22, "2017", "date"), Edit(6, 6, " not", "negation", bad_start=1), Edit(0, 2, "She", "entity")]
    new, spans = apply_edits(text, edits)
    assert new == "She was not at home in 2017."
    assert [new[s.start : s.end] for s in spans] == ["She", "not", "2017"]
    assert [s.kind for s in spans] == ["entity", "negation", "date"]


def test_apply_edits_rejects_overlap():
    with pytest.raises(DataError, match="overlap"):
        apply_edits("abcdef", [Edit(0, 3, "x", "entity"), Edit(2, 4, "y", "number")])


@pytest.mark.parametrize("kind", EDIT_KINDS)
def test_every_kind_can_occur_and_is_exact(kind):
    seen = False
    for seed in range(200):
        new, spans = perturb_summary(SUMMARY, DOCUMENT, random.Random(seed), DONORS)
        assert_exact_spans(SUMMARY, new, spans)
        seen |= any(s.kind == kind for s in spans)
    assert seen, f"no {kind} edit in 200 seeds"


def test_edit_counts_and_determinism():
    counts = set()
    for seed in range(50):
        first = perturb_summary(SUMMARY, DOCUMENT, random.Random(seed), DONORS)
        assert first == perturb_summary(SUMMARY, DOCUMENT, random.Random(seed), DONORS)
        counts.add(len(first[1]))
    assert counts == {1, 2, 3}
    for n in (1, 2, 3):
        assert len(perturb_summary(SUMMARY, DOCUMENT, random.Random(0), DONORS, n_edits=n)[1]) == n


def test_negation_span_covers_not_and_removal_covers_auxiliary():
    for seed in range(100):
        new, spans = perturb_summary("The team was happy.", "The team was happy.", random.Random(seed), n_edits=1)
        if spans[0].kind == "negation":
            assert new == "The team was not happy." and new[spans[0].start : spans[0].end] == "not"
        new, spans = perturb_summary("The team wasn't happy.", "The team was happy.", random.Random(seed), n_edits=1)
        if spans[0].kind == "negation":
            assert new == "The team was happy." and new[spans[0].start : spans[0].end] == "was"


def test_falls_back_to_invented_sentence():
    new, spans = perturb_summary("it rained", "it rained", random.Random(0), n_edits=3)
    assert [s.kind for s in spans] == ["invented"]
    assert new.endswith(" it rained") and new[spans[0].start : spans[0].end] == new[: -len(" it rained")]


def test_extract_names_skips_sentence_initial_words_and_stopwords():
    names = [n for _, _, n in extract_names('Police said. "Officers in London met The Football Association."')]
    assert names == ["London", "Football Association"]


def test_invalid_arguments():
    with pytest.raises(DataError, match="n_edits"):
        perturb_summary(SUMMARY, DOCUMENT, random.Random(0), n_edits=0)
    with pytest.raises(DataError, match="empty"):
        perturb_summary("  ", DOCUMENT, random.Random(0))


def test_build_perturbation_records():
    pairs = [("d1", DOCUMENT, SUMMARY), ("d2", DONORS[0], "Manchester United signed Paul Pogba in August.")]
    records = build_perturbation_records(pairs, seed=3)
    assert [r.id for r in records] == ["d1:faithful", "d1:perturbed", "d2:faithful", "d2:perturbed"]
    assert records == build_perturbation_records(pairs, seed=3)
    for faithful, perturbed in zip(records[::2], records[1::2]):
        assert faithful.sequence_label == 1 and faithful.bad_spans == () and faithful.doc_id == perturbed.doc_id
        assert perturbed.sequence_label == 0 and perturbed.faithful_response == faithful.response
        assert perturbed.meta["edits"] == [s.kind for s in perturbed.bad_spans]
        assert_exact_spans(faithful.response, perturbed.response, perturbed.bad_spans)


def test_real_halueval_summaries_many_seeds():
    halueval = pytest.importorskip("topl_core.data.halueval")
    try:
        rows = halueval.load_halueval_rows(limit=150)
    except DataError as e:
        pytest.skip(f"HaluEval not installed: {e}")
    for seed in range(3):
        records = halueval.halueval_perturbation_records(rows, seed)
        for r in records[1::2]:
            assert_exact_spans(r.faithful_response, r.response, r.bad_spans)
