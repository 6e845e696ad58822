"""The edits of a faithful summary S that make a perturbed S', each with the exact character span of its new text
(the `Edit` type and recipe "v1"'s kinds, each a fact of the summary changed; summarizer_edits.py holds recipe "v2"'s;
perturb.py draws and applies them).

Edit kinds (`Span.kind`):
- "entity": a capitalised name is swapped for another name found in the document or the donor texts;
- "number": a number (digits or a number word) gets a different value;
- "date": a month, weekday or year is changed;
- "negation": "not" is inserted after an auxiliary ("was" -> "was not"; the span covers "not"), or removed
  ("was not" / "wasn't" -> "was"; the span covers the remaining auxiliary);
- "relation": a verb/relation word from a curated list is swapped for its opposite ("won" -> "lost");
- "invented": a fabricated sentence (built from document entities, or an unverifiable claim) is inserted at a
  sentence boundary; the span covers the whole sentence.

Edits never overlap or touch. Every span covers exactly the new text of its edit, so the text outside the spans
of S' is the text of S outside the edited regions (up to the single space that joins an inserted word or
sentence to its neighbours).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..foundations.errors import DataError
from .records import Span

EDIT_KINDS: tuple[str, ...] = ("entity", "number", "date", "negation", "relation", "invented")

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


def word_re(pattern: str) -> str:
    """A regex for `pattern` as a whole word (not inside a longer word, contraction or hyphenated word)."""
    return rf"(?<![\w'’-])(?:{pattern})(?![\w'’-])"


def alternatives_re(words: Iterable[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


NAME_WORD = r"[A-Z][a-zà-öø-ÿ]+(?:[A-Z][a-zà-öø-ÿ]+)?(?:-[A-Z][a-zà-öø-ÿ]+)*"  # Smith, McIlroy, Jean-Marc
NAME_RE = re.compile(rf"(?<![\w'’-]){NAME_WORD}(?: {NAME_WORD})*(?![\w-])")
NUMBER_RE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w]|[.,]\d)")  # 7, 1,500, 2.5
NUMBER_WORD_RE = re.compile(word_re(alternatives_re(NUMBER_WORDS)), re.IGNORECASE)
YEAR_RE = re.compile(r"^(?:18|19|20)\d\d$")
# "May" is a month only after "in"/"of" or before a day number; otherwise it is usually the modal or a name.
DATE_WORD_RE = re.compile(
    word_re(alternatives_re([m for m in MONTHS if m != "May"] + list(WEEKDAYS)))
    + r"|(?<=\bin )May\b|(?<=\bof )May\b|\bMay(?= \d)"
)
RELATION_RE = re.compile(word_re(alternatives_re(RELATION_SWAPS)))
NEGATABLE_RE = re.compile(
    word_re(alternatives_re(AUXILIARIES))
    + r"(?= (?!not\b)[a-z])"
    + "|"
    + word_re(alternatives_re(PERFECT_AUXILIARIES))
    + r"(?= (?:been|[a-z]+(?:ed|en))\b)"
)
NEGATED_RE = re.compile(
    word_re(r"(?P<aux>" + alternatives_re(NEGATED_AUXILIARIES) + r") not")
    + "|"
    + word_re(r"(?P<short>" + alternatives_re(NEGATED_AUXILIARIES) + r")n['’]t")
    + "|"
    + word_re(r"(?P<contracted>" + alternatives_re(CONTRACTIONS) + ")"),
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


def entity_edits(summary: str, name_pool: Sequence[str], rng: random.Random) -> list[Edit]:
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


def number_edits(summary: str, rng: random.Random) -> list[Edit]:
    edits = [
        Edit(m.start(), m.end(), _changed_number(m.group(), rng), "number")
        for m in NUMBER_RE.finditer(summary)
        if not YEAR_RE.match(m.group())
    ]
    for m in NUMBER_WORD_RE.finditer(summary):
        others = [w for w in NUMBER_WORDS if w != m.group().lower()]
        edits.append(Edit(m.start(), m.end(), _match_case(m.group(), rng.choice(others)), "number"))
    return edits


def date_edits(summary: str, rng: random.Random) -> list[Edit]:
    edits = []
    for m in DATE_WORD_RE.finditer(summary):
        family = MONTHS if m.group() in MONTHS else WEEKDAYS
        edits.append(Edit(m.start(), m.end(), rng.choice([w for w in family if w != m.group()]), "date"))
    for m in NUMBER_RE.finditer(summary):
        if YEAR_RE.match(m.group()):
            shift = rng.choice((-5, -4, -3, -2, -1, 1, 2, 3, 4, 5))
            edits.append(Edit(m.start(), m.end(), str(int(m.group()) + shift), "date"))
    return edits


def negation_edits(summary: str) -> list[Edit]:
    edits = [Edit(m.end(), m.end(), " not", "negation", bad_start=1) for m in NEGATABLE_RE.finditer(summary)]
    for m in NEGATED_RE.finditer(summary):
        if m.group("contracted"):
            aux = _match_case(m.group("contracted"), CONTRACTIONS[m.group("contracted").lower()])
        else:
            aux = m.group("aux") or m.group("short")
        edits.append(Edit(m.start(), m.end(), aux, "negation"))
    return edits


def relation_edits(summary: str) -> list[Edit]:
    return [Edit(m.start(), m.end(), RELATION_SWAPS[m.group()], "relation") for m in RELATION_RE.finditer(summary)]


def invented_edits(summary: str, names: Sequence[str], rng: random.Random) -> list[Edit]:
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
