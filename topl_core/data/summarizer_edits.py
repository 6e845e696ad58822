"""Kinds closer to what summarizers get wrong (recipe "v2", `RECIPES`):
- "attribution": the speaker of a quote or claim ("X said", "according to X") becomes another name from the
  document (wrong attribution of who said/did what);
- "swap": two names of one summary sentence that both occur in the document exchange places (a wrong relation
  between entities that do occur in the document); both names are spans;
- "extrinsic": a fact absent from the document is added: an age after a name (", 45,"), a place ("in Leeds") or a
  time ("last year") before a sentence end; the span covers the added text (", 45,", "in Leeds");
- "modal": a modal verb or the tense of a copula changes ("will" -> "may", "was" -> "is");
- "copied": a document sentence absent from the summary is copied in with one entity/number/date/negation/relation
  edit inside it; only the edited words are bad, the copied words around them are good.

Each kind is a function summary (+ document, names, rng) -> candidate edits (fact_edits.Edit).
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from .fact_edits import (
    SENTENCE_END_RE,
    Edit,
    alternatives_re,
    apply_edits,
    date_edits,
    entity_edits,
    extract_names,
    negation_edits,
    number_edits,
    relation_edits,
    word_re,
)

ATTRIBUTION_AFTER_RE = re.compile(
    r" (?:(?:has|had|have|also|later) )?(?:said|says|told|claimed|announced|admitted|insisted|revealed|warned|"
    r"denied|added|explained|confirmed|described|argued|stated|wrote|tweeted)\b"
)
ACCORDING_TO_RE = re.compile(r"\baccording to $", re.IGNORECASE)


def _other_names(name: str, pool: Sequence[str], summary: str) -> list[str]:
    """Names of `pool` that share no word with `name` and do not occur in `summary`."""
    words = set(name.split())
    return [c for c in pool if not words & set(c.split()) and c not in summary]


def attribution_edits(summary: str, document: str, document_names: Sequence[str], rng: random.Random) -> list[Edit]:
    """The speaker of "X said …" / "according to X" becomes another speaker named in the document."""
    # Speakers are people and bodies: names of two words or more, or named at least twice in the document (a
    # one-word capitalised token seen once is often an ordinary word after a quote).
    speakers = [n for n in document_names if " " in n or len(re.findall(word_re(re.escape(n)), document)) > 1]
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


def swap_edits(summary: str, document: str) -> list[Edit]:
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


def extrinsic_edits(summary: str, document: str, rng: random.Random) -> list[Edit]:
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
MODAL_RE = re.compile(word_re(alternatives_re(MODAL_SWAPS)) + r"(?= [a-z])")


def modal_edits(summary: str) -> list[Edit]:
    return [Edit(m.start(), m.end(), MODAL_SWAPS[m.group()], "modal") for m in MODAL_RE.finditer(summary)]


COPIED_WORDS = (6, 40)  # length range of a document sentence worth copying in


def copied_edits(summary: str, document: str, names: Sequence[str], rng: random.Random) -> list[Edit]:
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
        for e in entity_edits(sentence, names, rng)
        + number_edits(sentence, rng)
        + date_edits(sentence, rng)
        + negation_edits(sentence)
        + relation_edits(sentence)
    ]
    if not inner:
        return []
    edit = rng.choice(inner)
    edited, (span,) = apply_edits(sentence, [edit])
    edits = [Edit(0, 0, edited + " ", "copied", span.start, span.end)]
    for m in SENTENCE_END_RE.finditer(summary):
        edits.append(Edit(m.end(), m.end(), " " + edited, "copied", span.start + 1, span.end + 1))
    return edits
