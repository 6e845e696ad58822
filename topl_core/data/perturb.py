"""Seeded perturbations of a faithful summary S into S' with exact character spans of every edit.

Edit kinds (`Span.kind`):
- "entity": a capitalised name is swapped for another name found in the document or the donor texts;
- "number": a number (digits or a number word) gets a different value;
- "date": a month, weekday or year is changed;
- "negation": "not" is inserted after an auxiliary ("was" -> "was not"; the span covers "not"), or removed
  ("was not" / "wasn't" -> "was"; the span covers the remaining auxiliary);
- "relation": a verb/relation word from a curated list is swapped for its opposite ("won" -> "lost");
- "invented": a fabricated sentence (built from document entities, or an unverifiable claim) is inserted at a
  sentence boundary; the span covers the whole sentence.

Kinds closer to what summarizers get wrong (recipe "v2", `RECIPES`):
- "attribution": the speaker of a quote or claim ("X said", "according to X") becomes another name from the
  document (wrong attribution of who said/did what);
- "swap": two names of one summary sentence that both occur in the document exchange places (a wrong relation
  between entities that do occur in the document); both names are spans;
- "extrinsic": a fact absent from the document is added: an age after a name (", 45,"), a place ("in Leeds") or a
  time ("last year") before a sentence end; the span covers the added text (", 45,", "in Leeds");
- "modal": a modal verb or the tense of a copula changes ("will" -> "may", "was" -> "is");
- "copied": a document sentence absent from the summary is copied in with one entity/number/date/negation/relation
  edit inside it; only the edited words are bad, the copied words around them are good.

Edits never overlap or touch. Every span covers exactly the new text of its edit, so the text outside the spans
of S' is the text of S outside the edited regions (up to the single space that joins an inserted word or
sentence to its neighbours).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import DataError
from .records import Record, Span

EDIT_KINDS: tuple[str, ...] = ("entity", "number", "date", "negation", "relation", "invented")
V2_KINDS: tuple[str, ...] = EDIT_KINDS + ("attribution", "swap", "extrinsic", "modal", "copied")
ALL_KINDS = V2_KINDS
MAX_EDITS = 3


@dataclass(frozen=True)
class Recipe:
    """How perturbation records are made: the edit kinds drawn from, and the share of documents whose records are
    lower-cased (document and both responses; spans unchanged) so that lower-cased text, as in some CNN/DM
    releases, is not foreign to a head."""

    kinds: tuple[str, ...] = EDIT_KINDS
    lowercase_share: float = 0.0


# "v1": the original six kinds (the default data set and the demo adapters); "v2": all kinds, 15% lower-cased.
RECIPES: dict[str, Recipe] = {"v1": Recipe(), "v2": Recipe(V2_KINDS, 0.15)}

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")

# Opposites for "relation" edits (matched in lower case only: "West Ham" and "First Minister" are names).
RELATION_SWAPS: dict[str, str] = {
    "won": "lost",
    "lost": "won",
    "win": "lose",
    "lose": "win",
    "wins": "loses",
    "loses": "wins",
    "beat": "lost to",
    "increased": "decreased",
    "decreased": "increased",
    "increase": "decrease",
    "decrease": "increase",
    "rose": "fell",
    "fell": "rose",
    "rise": "fall",
    "fall": "rise",
    "higher": "lower",
    "lower": "higher",
    "arrested": "released",
    "released": "arrested",
    "before": "after",
    "after": "before",
    "approved": "rejected",
    "rejected": "approved",
    "supported": "opposed",
    "opposed": "supported",
    "joined": "left",
    "hired": "fired",
    "fired": "hired",
    "bought": "sold",
    "sold": "bought",
    "buy": "sell",
    "sell": "buy",
    "killed": "injured",
    "injured": "killed",
    "died": "survived",
    "survived": "died",
    "guilty": "innocent",
    "innocent": "guilty",
    "convicted": "acquitted",
    "acquitted": "convicted",
    "opened": "closed",
    "closed": "opened",
    "started": "ended",
    "ended": "started",
    "first": "last",
    "last": "first",
    "largest": "smallest",
    "smallest": "largest",
    "biggest": "smallest",
    "highest": "lowest",
    "lowest": "highest",
    "praised": "criticised",
    "criticised": "praised",
    "criticized": "praised",
    "confirmed": "denied",
    "denied": "confirmed",
    "allowed": "banned",
    "banned": "allowed",
    "agreed": "refused",
    "refused": "agreed",
    "older": "younger",
    "younger": "older",
    "north": "south",
    "south": "north",
    "east": "west",
    "west": "east",
    "accepted": "rejected",
    "gained": "lost",
    "raised": "lowered",
    "lowered": "raised",
    "ally": "rival",
    "rival": "ally",
}

NAMED_INVENTIONS = (
    "{name} later denied any involvement.",
    "{name} declined to comment on the allegations.",
    "{name} is expected to appeal the decision next month.",
    "{name} had been warned about the risks two years earlier.",
    "A spokesperson for {name} said an internal investigation is under way.",
)
UNVERIFIABLE_CLAIMS = (
    "The incident is believed to be the first of its kind in the country.",
    "Officials said the cost could run into millions of pounds.",
    "Critics have called for an independent inquiry into the matter.",
    "The announcement came as a surprise to many observers.",
)

AUXILIARIES = ("is", "are", "was", "were", "will", "would", "can", "could", "should", "did", "does")
PERFECT_AUXILIARIES = ("has", "have", "had")  # negated only before "been" or a participle in -ed/-en
NEGATED_AUXILIARIES = AUXILIARIES + PERFECT_AUXILIARIES + ("do",)  # "do not" -> "do" works; "do" -> "do not" rarely
CONTRACTIONS = {"won't": "will", "can't": "can", "cannot": "can"}

# Capitalised words that start phrases but are not names.
NON_NAME_WORDS = (
    frozenset(
        "The A An This That These Those He She It They We I You His Her Its Their Our My Your In On At For From "
        "By With After Before But And Or If When While As Some Many Most All Mr Mrs Ms Dr".split()
    )
    | frozenset(MONTHS)
    | frozenset(WEEKDAYS)
)
MAX_NAME_WORDS = 4


def _word(pattern: str) -> str:
    """A regex for `pattern` as a whole word (not inside a longer word, contraction or hyphenated word)."""
    return rf"(?<![\w'’-])(?:{pattern})(?![\w'’-])"


def _alternatives(words: Iterable[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


NAME_WORD = r"[A-Z][a-zà-öø-ÿ]+(?:[A-Z][a-zà-öø-ÿ]+)?(?:-[A-Z][a-zà-öø-ÿ]+)*"  # Smith, McIlroy, Jean-Marc
NAME_RE = re.compile(rf"(?<![\w'’-]){NAME_WORD}(?: {NAME_WORD})*(?![\w-])")
NUMBER_RE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|[.,]\d)")  # 7, 1,500, 2.5
NUMBER_WORD_RE = re.compile(_word(_alternatives(NUMBER_WORDS)), re.IGNORECASE)
YEAR_RE = re.compile(r"^(?:18|19|20)\d\d$")
# "May" is a month only after "in"/"of" or before a day number; otherwise it is usually the modal or a name.
DATE_WORD_RE = re.compile(
    _word(_alternatives([m for m in MONTHS if m != "May"] + list(WEEKDAYS)))
    + r"|(?<=\bin )May\b|(?<=\bof )May\b|\bMay(?= \d)"
)
RELATION_RE = re.compile(_word(_alternatives(RELATION_SWAPS)))
NEGATABLE_RE = re.compile(
    _word(_alternatives(AUXILIARIES))
    + r"(?= (?!not\b)[a-z])"
    + "|"
    + _word(_alternatives(PERFECT_AUXILIARIES))
    + r"(?= (?:been|[a-z]+(?:ed|en))\b)"
)
NEGATED_RE = re.compile(
    _word(r"(?P<aux>" + _alternatives(NEGATED_AUXILIARIES) + r") not")
    + "|"
    + _word(r"(?P<short>" + _alternatives(NEGATED_AUXILIARIES) + r")n['’]t")
    + "|"
    + _word(r"(?P<contracted>" + _alternatives(CONTRACTIONS) + ")"),
    re.IGNORECASE,
)
OPENERS = r"[\"'‘“(\[]*"
SENTENCE_END_RE = re.compile(r"[.!?][\"'’”)]*(?=\s|$)")


@dataclass(frozen=True)
class Edit:
    """Replace `summary[start:end]` by `new_text`; the bad span is `new_text[bad_start:bad_end]`."""

    start: int
    end: int
    new_text: str
    kind: str
    bad_start: int = 0
    bad_end: int | None = None
    also_bad: tuple[tuple[int, int], ...] = ()  # further bad spans of new_text (a swap's second name)

    def conflicts_with(self, other: "Edit") -> bool:
        """True when the two edited regions overlap or touch (closed intervals)."""
        return self.start <= other.end and other.start <= self.end


def _match_case(template: str, word: str) -> str:
    """`word` written with the capitalisation of `template` (UPPER, Title or lower)."""
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _sentence_starts(text: str) -> set[int]:
    """Offsets of the first word of every sentence (after any opening quotes or brackets)."""
    starts = {re.match(OPENERS, text).end()}
    for m in SENTENCE_END_RE.finditer(text):
        gap = re.match(r"\s+" + OPENERS, text[m.end() :])
        if gap:
            starts.add(m.end() + gap.end())
    return starts


def extract_names(text: str) -> list[tuple[int, int, str]]:
    """Capitalised names in `text` as (start, end, name).

    Runs of capitalised words are split at non-name words ("The", "In", months, ...). A single capitalised word
    that starts a sentence is skipped: it is usually an ordinary word.
    """
    sentence_starts = _sentence_starts(text)
    names = []

    def flush(run: list[tuple[int, str]]) -> None:
        if run and len(run) <= MAX_NAME_WORDS and not (len(run) == 1 and run[0][0] in sentence_starts):
            name = " ".join(word for _, word in run)
            names.append((run[0][0], run[0][0] + len(name), name))

    for m in NAME_RE.finditer(text):
        run: list[tuple[int, str]] = []
        position = m.start()
        for word in m.group().split(" "):
            if word in NON_NAME_WORDS:
                flush(run)
                run = []
            else:
                run.append((position, word))
            position += len(word) + 1
        flush(run)
    return names


def _entity_edits(summary: str, name_pool: Sequence[str], rng: random.Random) -> list[Edit]:
    edits = []
    for start, end, name in extract_names(summary):
        words = set(name.split())
        # A replacement shares no word with the original ("Smith" -> "John Smith" would be the same person).
        candidates = [c for c in name_pool if not words & set(c.split()) and c not in summary]
        same_length = [c for c in candidates if len(c.split()) == len(words)]
        if candidates:
            edits.append(Edit(start, end, rng.choice(same_length or candidates), "entity"))
    return edits


def _changed_number(text: str, rng: random.Random) -> str:
    """A different number written like `text` (same thousands separators and decimal places)."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    value = float(text.replace(",", ""))
    step = 10.0**-decimals
    options = [value + d * step for d in (-3, -2, -1, 1, 2, 3)] + [value * 2, value * 10]
    if value >= 2:
        options.append(value / 2)
    fmt = f"{{:,.{decimals}f}}" if "," in text else f"{{:.{decimals}f}}"
    new_texts = [fmt.format(v) for v in options if v >= 0]
    return rng.choice([t for t in dict.fromkeys(new_texts) if t != text])


def _number_edits(summary: str, rng: random.Random) -> list[Edit]:
    edits = [
        Edit(m.start(), m.end(), _changed_number(m.group(), rng), "number")
        for m in NUMBER_RE.finditer(summary)
        if not YEAR_RE.match(m.group())
    ]
    for m in NUMBER_WORD_RE.finditer(summary):
        others = [w for w in NUMBER_WORDS if w != m.group().lower()]
        edits.append(Edit(m.start(), m.end(), _match_case(m.group(), rng.choice(others)), "number"))
    return edits


def _date_edits(summary: str, rng: random.Random) -> list[Edit]:
    edits = []
    for m in DATE_WORD_RE.finditer(summary):
        family = MONTHS if m.group() in MONTHS else WEEKDAYS
        edits.append(Edit(m.start(), m.end(), rng.choice([w for w in family if w != m.group()]), "date"))
    for m in NUMBER_RE.finditer(summary):
        if YEAR_RE.match(m.group()):
            shift = rng.choice((-5, -4, -3, -2, -1, 1, 2, 3, 4, 5))
            edits.append(Edit(m.start(), m.end(), str(int(m.group()) + shift), "date"))
    return edits


def _negation_edits(summary: str) -> list[Edit]:
    edits = [Edit(m.end(), m.end(), " not", "negation", bad_start=1) for m in NEGATABLE_RE.finditer(summary)]
    for m in NEGATED_RE.finditer(summary):
        if m.group("contracted"):
            aux = _match_case(m.group("contracted"), CONTRACTIONS[m.group("contracted").lower()])
        else:
            aux = m.group("aux") or m.group("short")
        edits.append(Edit(m.start(), m.end(), aux, "negation"))
    return edits


def _relation_edits(summary: str) -> list[Edit]:
    return [Edit(m.start(), m.end(), RELATION_SWAPS[m.group()], "relation") for m in RELATION_RE.finditer(summary)]


def _invented_edits(summary: str, names: Sequence[str], rng: random.Random) -> list[Edit]:
    """Insert a fabricated sentence (about one of the multi-word `names`, which are mostly people and
    organisations, or an unverifiable claim) before the first sentence or after any sentence-final punctuation."""
    names = [n for n in names if " " in n]
    if names and rng.random() < 0.7:
        sentence = rng.choice(NAMED_INVENTIONS).format(name=rng.choice(names))
    else:
        sentence = rng.choice(UNVERIFIABLE_CLAIMS)
    edits = [Edit(0, 0, sentence + " ", "invented", bad_end=len(sentence))]
    for m in SENTENCE_END_RE.finditer(summary):
        edits.append(Edit(m.end(), m.end(), " " + sentence, "invented", bad_start=1))
    return edits


ATTRIBUTION_AFTER_RE = re.compile(
    r" (?:(?:has|had|have|also|later) )?(?:said|says|told|claimed|announced|admitted|insisted|revealed|warned|"
    r"denied|added|explained|confirmed|described|argued|stated|wrote|tweeted)\b"
)
ACCORDING_TO_RE = re.compile(r"\baccording to $", re.IGNORECASE)


def _other_names(name: str, pool: Sequence[str], summary: str) -> list[str]:
    """Names of `pool` that share no word with `name` and do not occur in `summary`."""
    words = set(name.split())
    return [c for c in pool if not words & set(c.split()) and c not in summary]


def _attribution_edits(summary: str, document: str, document_names: Sequence[str], rng: random.Random) -> list[Edit]:
    """The speaker of "X said …" / "according to X" becomes another speaker named in the document."""
    # Speakers are people and bodies: names of two words or more, or named at least twice in the document (a
    # one-word capitalised token seen once is often an ordinary word after a quote).
    speakers = [n for n in document_names if " " in n or len(re.findall(_word(re.escape(n)), document)) > 1]
    edits = []
    for start, end, name in extract_names(summary):
        if ATTRIBUTION_AFTER_RE.match(summary, end) or ACCORDING_TO_RE.search(summary[:start]):
            others = _other_names(name, speakers, summary)
            same_length = [c for c in others if len(c.split()) == len(name.split())]
            if others:
                edits.append(Edit(start, end, rng.choice(same_length or others), "attribution"))
    return edits


def _sentence_index(text: str) -> list[int]:
    """For every character of `text`, the index of its sentence (sentences end at SENTENCE_END_RE)."""
    index, sentence, cursor = [], 0, 0
    for m in SENTENCE_END_RE.finditer(text):
        index += [sentence] * (m.end() - cursor)
        sentence, cursor = sentence + 1, m.end()
    return index + [sentence] * (len(text) - cursor)


def _swap_edits(summary: str, document: str) -> list[Edit]:
    """Two different names of one sentence, both found in the document, exchange places (both are spans)."""
    names = [(s, e, n) for s, e, n in extract_names(summary) if n in document]
    sentence = _sentence_index(summary)
    edits = []
    for i, (s1, e1, n1) in enumerate(names):
        for s2, e2, n2 in names[i + 1 :]:
            if sentence[s1] != sentence[s2] or set(n1.split()) & set(n2.split()):
                continue
            middle = summary[e1:s2]
            new_text = n2 + middle + n1
            edits.append(Edit(s1, e2, new_text, "swap", 0, len(n2), ((len(n2) + len(middle), len(new_text)),)))
    return edits


PLACES = ("Leeds", "Bristol", "Glasgow", "Cardiff", "Dublin", "Chicago", "Houston", "Sydney", "Toronto", "Madrid")
TIMES = ("last year", "in 2009", "last month", "earlier this week", "two years ago", "on Tuesday")


def _extrinsic_edits(summary: str, document: str, rng: random.Random) -> list[Edit]:
    """Add a fact the document does not hold: an age after a multi-word name, or a place or time before a sentence
    end (each filler checked absent from the document)."""
    doc = document.lower()
    edits = []
    ages = [a for a in range(19, 80) if str(a) not in document]
    for start, end, name in extract_names(summary):
        if " " in name and ages and re.match(r" [a-z]", summary[end : end + 2]):
            age = str(rng.choice(ages))
            edits.append(Edit(end, end, f", {age},", "extrinsic"))  # the commas too: the text outside is S
    fillers = [f"in {p}" for p in PLACES if p.lower() not in doc] + [t for t in TIMES if t.split()[-1] not in doc]
    for m in SENTENCE_END_RE.finditer(summary):
        if fillers and m.start() > 0 and summary[m.start() - 1].isalnum():
            edits.append(Edit(m.start(), m.start(), " " + rng.choice(fillers), "extrinsic", bad_start=1))
    return edits


# Modal verbs and copula tenses; matched in lower case ("May" is a month or a name).
MODAL_SWAPS: dict[str, str] = {
    "will": "may",
    "may": "will",
    "would": "might",
    "might": "will",
    "could": "will",
    "should": "will",
    "must": "may",
    "is": "was",
    "was": "is",
    "are": "were",
    "were": "are",
}
MODAL_RE = re.compile(_word(_alternatives(MODAL_SWAPS)) + r"(?= [a-z])")


def _modal_edits(summary: str) -> list[Edit]:
    return [Edit(m.start(), m.end(), MODAL_SWAPS[m.group()], "modal") for m in MODAL_RE.finditer(summary)]


COPIED_WORDS = (6, 40)  # length range of a document sentence worth copying in


def _copied_edits(summary: str, document: str, names: Sequence[str], rng: random.Random) -> list[Edit]:
    """Copy a document sentence that the summary lacks in, with one intrinsic edit inside it (its span only)."""
    sentences = [
        s.strip()
        for s in re.split(r"(?<=[.!?])\s+", document)
        if COPIED_WORDS[0] <= len(s.split()) <= COPIED_WORDS[1] and s.strip() not in summary
    ]
    if not sentences:
        return []
    sentence = rng.choice(sentences)
    inner = [
        e
        for e in _entity_edits(sentence, names, rng)
        + _number_edits(sentence, rng)
        + _date_edits(sentence, rng)
        + _negation_edits(sentence)
        + _relation_edits(sentence)
    ]
    if not inner:
        return []
    edit = rng.choice(inner)
    edited, (span,) = apply_edits(sentence, [edit])
    edits = [Edit(0, 0, edited + " ", "copied", span.start, span.end)]
    for m in SENTENCE_END_RE.finditer(summary):
        edits.append(Edit(m.end(), m.end(), " " + edited, "copied", span.start + 1, span.end + 1))
    return edits


def _candidate_edits(
    summary: str, document: str, donor_texts: Sequence[str], rng: random.Random, kinds: Sequence[str] = EDIT_KINDS
) -> dict[str, list[Edit]]:
    document_names = list(dict.fromkeys(n for _, _, n in extract_names(document)))
    donor_names = list(dict.fromkeys(n for text in donor_texts for _, _, n in extract_names(text)))
    candidates = {
        "entity": _entity_edits(summary, list(dict.fromkeys(document_names + donor_names)), rng),
        "number": _number_edits(summary, rng),
        "date": _date_edits(summary, rng),
        "negation": _negation_edits(summary),
        "relation": _relation_edits(summary),
        "invented": _invented_edits(summary, document_names or donor_names, rng),
    }
    # The v2 kinds draw from the rng only when asked for, so v1 data stays what it was for a seed.
    more = {
        "attribution": lambda: _attribution_edits(summary, document, document_names, rng),
        "swap": lambda: _swap_edits(summary, document),
        "extrinsic": lambda: _extrinsic_edits(summary, document, rng),
        "modal": lambda: _modal_edits(summary),
        "copied": lambda: _copied_edits(summary, document, document_names or donor_names, rng),
    }
    candidates |= {kind: make() for kind, make in more.items() if kind in kinds}
    return {kind: candidates[kind] for kind in kinds}


def apply_edits(summary: str, edits: Iterable[Edit]) -> tuple[str, tuple[Span, ...]]:
    """Apply non-overlapping edits; spans are offsets in the new text (each edit shifts the ones after it)."""
    pieces: list[str] = []
    spans = []
    cursor = new_length = 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.start < cursor:
            raise DataError(f"edit {e} overlaps the previous edit ending at {cursor}; edits must not overlap.")
        kept = summary[cursor : e.start]
        pieces += [kept, e.new_text]
        new_length += len(kept)
        bad_end = len(e.new_text) if e.bad_end is None else e.bad_end
        for start, end in ((e.bad_start, bad_end),) + e.also_bad:
            spans.append(Span(new_length + start, new_length + end, e.kind))
        new_length += len(e.new_text)
        cursor = e.end
    pieces.append(summary[cursor:])
    return "".join(pieces), tuple(spans)


def perturb_summary(
    summary: str,
    document: str,
    rng: random.Random,
    donor_texts: Sequence[str] = (),
    n_edits: int | None = None,
    kinds: Sequence[str] = EDIT_KINDS,
) -> tuple[str, tuple[Span, ...]]:
    """Perturb `summary` with `n_edits` non-overlapping edits (random 1-3 when None).

    Each edit picks a kind uniformly among the kinds that still have a candidate not touching an earlier edit,
    then a random candidate of that kind. Fewer edits are made when candidates run out; at least one is always
    made (an invented sentence at the start of the summary is always possible). Returns S' and the spans of
    S' that were edited, sorted by position.
    """
    if not summary.strip():
        raise DataError("perturb_summary: the summary is empty; drop that row or give it a summary.")
    if n_edits is None:
        n_edits = rng.randint(1, MAX_EDITS)
    if n_edits < 1:
        raise DataError(f"perturb_summary: n_edits={n_edits} must be at least 1 (or None for a random 1-{MAX_EDITS}).")
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown or "invented" not in kinds:
        raise DataError(
            f"perturb_summary: kinds {sorted(kinds)} must be among {ALL_KINDS} and include 'invented' (the edit "
            "that is always possible)."
        )
    candidates = _candidate_edits(summary, document, donor_texts, rng, kinds)
    chosen: list[Edit] = []
    for _ in range(n_edits):
        free = {
            k: [e for e in edits if not any(e.conflicts_with(c) for c in chosen)] for k, edits in candidates.items()
        }
        open_kinds = [k for k in kinds if free[k]]
        if not open_kinds:
            break
        edit = rng.choice(free[rng.choice(open_kinds)])
        chosen.append(edit)
        if edit.kind in ("invented", "copied"):  # their candidates insert the same sentence: insert it once
            candidates[edit.kind] = []
    return apply_edits(summary, chosen)


def build_perturbation_records(
    pairs: Iterable[tuple[str, str, str]],
    seed: int,
    source: str = "halueval-perturbed",
    donors_per_document: int = 2,
    progress=None,
    recipe: Recipe = RECIPES["v1"],
) -> list[Record]:
    """Two records per (doc_id, document, faithful_summary): the faithful summary (all good) and a perturbed one.

    Entity swaps and invented sentences may also draw names from `donors_per_document` other documents of
    `pairs`. Each document's edits come from `random.Random(f"{seed}:{doc_id}")`: deterministic for a seed.
    `recipe` picks the edit kinds and the lower-cased share (drawn from a second generator, so that a recipe
    without lower-casing gives the same records as before it existed). `progress(done, total)` is called after
    each document.
    """
    pairs = list(pairs)
    n_donors = min(donors_per_document, len(pairs) - 1)
    records = []
    for index, (doc_id, document, summary) in enumerate(pairs):
        rng = random.Random(f"{seed}:{doc_id}")
        other_indices = (i + (i >= index) for i in rng.sample(range(len(pairs) - 1), n_donors))  # skip `index`
        donors = [pairs[i][1] for i in other_indices]
        perturbed, spans = perturb_summary(summary, document, rng, donors, kinds=recipe.kinds)
        if recipe.lowercase_share and random.Random(f"{seed}:{doc_id}:case").random() < recipe.lowercase_share:
            document, summary, perturbed = _lowercased(document, summary, perturbed)
        records.append(
            Record(
                id=f"{doc_id}:faithful",
                document=document,
                response=summary,
                sequence_label=1,
                source=source,
                doc_id=doc_id,
            )
        )
        records.append(
            Record(
                id=f"{doc_id}:perturbed",
                document=document,
                response=perturbed,
                bad_spans=spans,
                sequence_label=0,
                faithful_response=summary,
                source=source,
                doc_id=doc_id,
                meta={"edits": [s.kind for s in spans]},
            )
        )
        if progress is not None:
            progress(index + 1, len(pairs))
    return records


def _lowercased(*texts: str) -> tuple[str, ...]:
    """The texts lower-cased, or unchanged when lower-casing would change a length (and so move the spans)."""
    lowered = tuple(t.lower() for t in texts)
    return lowered if all(len(a) == len(b) for a, b in zip(texts, lowered)) else texts
