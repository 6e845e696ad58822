import random
import re
from dataclasses import replace

import pytest

from topl_core.data.fact_edits import EDIT_KINDS, Edit, apply_edits, extract_names
from topl_core.data.perturb import ALL_KINDS, RECIPES, build_perturbation_records, perturb_summary
from topl_core.data.records import Span
from topl_core.foundations.errors import DataError

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


def without_copied(perturbed: str, spans: tuple[Span, ...], document: str) -> tuple[str, tuple[Span, ...]]:
    """S' with its copied-in sentence removed, after checking that sentence: outside its one bad span it is a
    verbatim document sentence D = D[:a] + (replaced text) + D[len(D) - c:], the span taking the replaced text's
    place (different text, or an insertion)."""
    copied = [s for s in spans if s.kind == "copied"]
    if not copied:
        return perturbed, spans
    (span,) = copied
    bad = perturbed[span.start : span.end]
    found, best = None, 0
    for sentence in re.split(r"(?<=[.!?])\s+", document):
        for a in range(len(sentence) + 1):
            left = perturbed[: span.start]
            if not (left.endswith(sentence[:a]) or left.endswith(sentence[:a] + " ")):  # " not" inserted
                continue
            c = next(
                c
                for c in range(len(sentence) - a, -1, -1)
                if perturbed.startswith(sentence[len(sentence) - c :], span.end) or c == 0
            )
            if sentence[a : len(sentence) - c] != bad and a + c > max(best, len(sentence) // 2):
                found, best = (span.start - a - (not left.endswith(sentence[:a])), span.end + c), a + c
    assert found, f"copied sentence is not a document sentence outside its span: {perturbed!r} {span}"
    cut_start, cut_end = (found[0] - 1, found[1]) if found[0] > 0 else (0, found[1] + 1)
    shift = cut_end - cut_start
    kept = tuple(
        s if s.end <= cut_start else Span(s.start - shift, s.end - shift, s.kind) for s in spans if s is not span
    )
    return perturbed[:cut_start] + perturbed[cut_end:], kept


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k not in EDIT_KINDS])
def test_every_v2_kind_can_occur_and_is_exact(kind):
    """Recipe v2's kinds: each occurs, and every span is exactly its edit's new text (a swap's two names are two
    spans; a copied sentence is good text except its one edited region)."""
    seen = 0
    for seed in range(200):
        summary = SUMMARY + " On Saturday, Eden Hazard scored for Chelsea against Arsenal."
        new, spans = perturb_summary(summary, DOCUMENT, random.Random(seed), DONORS, kinds=ALL_KINDS)
        seen += sum(s.kind == kind for s in spans)
        rest, rest_spans = without_copied(new, spans, DOCUMENT)
        assert_exact_spans(summary, rest, rest_spans)
    assert seen, f"no {kind} edit in 200 seeds"


@pytest.mark.parametrize(
    "kind, summary, document, expected",
    [
        ("attribution", "Jose Mourinho said the team was happy.", DOCUMENT, [["Eden Hazard"], ["Stamford Bridge"]]),
        ("swap", "On Saturday Chelsea beat Arsenal.", DOCUMENT, [["Arsenal", "Chelsea"]]),
        ("modal", "The club will appeal.", "The club will appeal.", [["may"]]),
    ],
)
def test_v2_kind_examples(kind, summary, document, expected):
    for seed in range(100):
        new, spans = perturb_summary(summary, document, random.Random(seed), n_edits=1, kinds=("invented", kind))
        if spans[0].kind == kind:
            assert [new[s.start : s.end] for s in spans] in expected
            return
    pytest.fail(f"no {kind} edit")


def test_extrinsic_facts_are_absent_from_the_document():
    document = "Jose Mourinho said the team was happy in London."
    for seed in range(100):
        new, spans = perturb_summary(
            "Jose Mourinho praised the team.", document, random.Random(seed), n_edits=1, kinds=("invented", "extrinsic")
        )
        for s in spans:
            if s.kind == "extrinsic":
                added = new[s.start : s.end].strip(",")
                assert added.split()[-1] not in document, added


def test_recipes_are_deterministic_and_v1_ignores_the_new_kinds():
    pairs = [("d1", DOCUMENT, SUMMARY), ("d2", DONORS[0], "Manchester United signed Paul Pogba in August.")]
    v1 = build_perturbation_records(pairs, seed=3)
    assert v1 == build_perturbation_records(pairs, seed=3, recipe=RECIPES["v1"])
    assert not {s.kind for r in v1 for s in r.bad_spans} - set(EDIT_KINDS)
    v2 = build_perturbation_records(pairs * 1, seed=3, recipe=RECIPES["v2"])
    assert v2 == build_perturbation_records(pairs, seed=3, recipe=RECIPES["v2"])
    everything_lowercased = build_perturbation_records(pairs, seed=3, recipe=replace(RECIPES["v2"], lowercase_share=1))
    for r, lower in zip(v2, everything_lowercased):
        assert lower.response == r.response.lower() and lower.document == r.document.lower()
        assert lower.bad_spans == r.bad_spans


def test_unknown_or_incomplete_kinds_are_refused():
    with pytest.raises(DataError, match="invented"):
        perturb_summary(SUMMARY, DOCUMENT, random.Random(0), kinds=("entity",))
    with pytest.raises(DataError, match="must be among"):
        perturb_summary(SUMMARY, DOCUMENT, random.Random(0), kinds=("invented", "typo"))


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
    for r in halueval.halueval_perturbation_records(rows, 0, recipe="v2")[1::2]:
        if r.document.islower():  # a lower-cased document: compare with the lower-cased faithful summary
            assert r.faithful_response == r.faithful_response.lower()
        rest, rest_spans = without_copied(r.response, r.bad_spans, r.document)
        assert_exact_spans(r.faithful_response, rest, rest_spans)
