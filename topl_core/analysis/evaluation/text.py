"""Text analysis shared by the lexical scorer and the labelling of the model's own summaries: sentences (with the
abbreviations that do not end one), words as the lexical rules read them (stems, numbers, names), CLIFF's spaced
hyphens.

    split_sentences(text) -> list[str], count_sentences(text) -> int
    analysed_words(text) -> Iterator[Word]      every word with its offsets, stem (content words), number, name flag
    analyse_text(text) -> AnalysedText           the words, content stems, names and numbers of a text
    stem(word), join_spaced_hyphens(text)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, NamedTuple

# --- sentences ------------------------------------------------------------------------------------------------

_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "prof",
    "st",
    "sr",
    "jr",
    "gen",
    "col",
    "lt",
    "sgt",
    "capt",
    "gov",
    "sen",
    "rep",
    "rev",
    "no",
    "vs",
    "etc",
    "inc",
    "ltd",
    "co",
    "corp",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "mt",
    "ft",
    "approx",
    "fig",
    "al",
    "u.s",
    "u.k",
    "u.n",
    "e.g",
    "i.e",
}
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+|$)")


def split_sentences(text: str) -> list[str]:
    """Sentences of a summary: a break after . ! ? (and closing quotes/brackets) followed by whitespace and an
    upper-case letter, digit, quote or bracket; never after a known abbreviation ("Mr.", "U.S.") or a single-letter
    initial ("J. K. Rowling"). Line breaks always separate. Empty pieces are dropped; text without any break is one
    sentence."""
    sentences: list[str] = []
    for block in re.split(r"\n\s*", text):
        start = 0
        for m in _BOUNDARY.finditer(block):
            end = m.end()
            rest = block[end:].lstrip()
            if rest and not re.match(r"[A-Z0-9\"'“‘(\[]", rest):
                continue
            before = block[start : m.start()].split()
            last = before[-1].lower().rstrip(".") if before else ""
            if block[m.start()] == "." and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
                continue
            piece = block[start:end].strip()
            if piece:
                sentences.append(piece)
            start = end
        tail = block[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


# --- words ---------------------------------------------------------------------------------------------------

_STOPWORDS = frozenset(
    """a an the and or but if then else of at by for with about against between into through during before after
    above below to from up down in out on off over under again further once here there when where why how all any
    both each few more most other some such no nor not only own same so than too very can will just should now is
    are was were be been being have has had having do does did doing would could might must shall may i me my we our
    you your he him his she her it its they them their what which who whom this that these those am as until while
    also said says say told according s t one mr mrs ms new year years last first two time people""".split()
)
# "one"/"two"/"first" are stopwords as words; as numbers they are matched by the number rule below.
_NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
    "million": 10**6,
    "billion": 10**9,
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
    "half": 0.5,
    "dozen": 12,
    "twice": 2,
    "once": 1,
}
_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?|\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.!?]")


@lru_cache(maxsize=65536)  # the same words come back in every text: stemming is most of the scorer's time
def stem(word: str) -> str:
    """A light suffix stripper (plural, past, gerund, adverb) so "killed"/"kills"/"killing" meet "kill"."""
    for suffix, keep in (("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("ly", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + keep
    return word


def word_number(token: str) -> float | None:
    low = token.lower()
    if low in _NUMBER_WORDS:
        return float(_NUMBER_WORDS[low])
    if token[0].isdigit():
        try:
            return float(token.replace(",", ""))
        except ValueError:
            return None
    return None


class Word(NamedTuple):  # a tuple, not a dataclass: texts have millions of words and a tuple is built fastest
    """One word of a text as the lexical rules read it, with its character offsets."""

    start: int
    end: int
    low: str  # lower-cased, possessive 's dropped
    number: float | None  # its value when it is a number (digits or a number word)
    stem: str | None  # its stem when it is a content word (not a stopword, not a digit, more than one letter)
    name: bool  # a capitalised content word that does not start a sentence


def analysed_words(text: str) -> Iterator[Word]:
    sentence_start = True
    for m in _WORD.finditer(text):
        tok = m.group(0)
        low = tok.lower().replace("’", "'")
        low = low[:-2] if low.endswith("'s") else low
        num = word_number(tok)
        if num is not None and not (tok[0].isdigit() or low not in ("one", "once", "second")):
            num = None
        content = not tok[0].isdigit() and low not in _STOPWORDS and len(low) > 1
        yield Word(
            m.start(),
            m.end(),
            low,
            num,
            stem(low) if content else None,
            content and tok[0].isupper() and not sentence_start,
        )
        sentence_start = bool(_SENTENCE_END.match(text[m.end() : m.end() + 2]))


@dataclass(frozen=True)
class AnalysedText:
    words: tuple[str, ...]  # lower-cased word tokens
    content: tuple[str, ...]  # stems of content words, in order
    names: tuple[str, ...]  # lower-cased capitalised non-stopwords (not counting a sentence's first word)
    numbers: tuple[float, ...]


def analyse_text(text: str) -> AnalysedText:
    words = list(analysed_words(join_spaced_hyphens(text)))
    return AnalysedText(
        tuple(w.low for w in words),
        tuple(w.stem for w in words if w.stem is not None),
        tuple(w.low for w in words if w.name),
        tuple(w.number for w in words if w.number is not None),
    )


def join_spaced_hyphens(text: str) -> str:
    """CLIFF's tokenised "al - Wefaq" → "al-Wefaq"."""
    return re.sub(r"\s+-\s+", "-", text)
