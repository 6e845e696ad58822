"""Cheap controls of token-level detection, defined once: what a reviewer asks of any detector first. Does it merely
flag words the source document does not contain (benchmarks whose answer sits in the prompt reward exactly that)?
Each control scores a response's tokens from the document's text and the tokens' character offsets in the response
alone — no model — higher meaning "looks bad", so its AUROC stands in the same table as the head's and surprisal's,
on the same tokens, with the same record-bootstrap interval (studies/detection_stats.bootstrap_auroc).

    CONTROLS                                       name → Control(help, score): the controls, in table order
    LEXICAL                                        "lexical control", the first
    control_scores(document, response, offsets) -> {name: (n,) float array}, one value per token
    labelled_controls(records, responses, offsets, gold) -> {name: array}   over the labelled tokens of many records,
                                                   in the order detection tables concatenate them
    words(text) -> [(start, end, word)]            the words the controls compare, case-folded

A word is a run of letters and digits (Unicode; "1,200" is two words, "Smith's" two), compared case-folded; a token
takes the verdict of every word it touches (a sub-word token the whole word's, a token of spaces and punctuation
none), so tokens that split one word agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[tuple[int, int, str]]:
    """(start, end, case-folded word) of every word of `text` (a run of letters and digits)."""
    return [(m.start(), m.end(), m.group().casefold()) for m in WORD.finditer(text)]


def _per_token(response: str, offsets: np.ndarray, marked: Sequence[tuple[int, int]]) -> np.ndarray:
    """1.0 for each token (character offsets into `response`) that touches a marked character span, else 0.0."""
    chars = np.zeros(len(response) + 1, dtype=np.int64)
    for start, end in marked:
        chars[start:end] = 1
    cum = np.concatenate([[0], np.cumsum(chars)])
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    start = np.clip(offsets[:, 0], 0, len(response))
    end = np.clip(offsets[:, 1], start, len(response))
    return ((cum[end] - cum[start]) > 0).astype(np.float64)


def _absent(document: str, response: str) -> list[tuple[int, int, str]]:
    present = {w for _, _, w in words(document)}
    return [(s, e, w) for s, e, w in words(response) if w not in present]


def absent_word(document: str, response: str, offsets: np.ndarray) -> np.ndarray:
    """1 where the token's word does not occur in the document."""
    return _per_token(response, offsets, [(s, e) for s, e, _ in _absent(document, response)])


def absent_number_or_name(document: str, response: str, offsets: np.ndarray) -> np.ndarray:
    """1 where the token's word is a number (holds a digit) or capitalised, and does not occur in the document: the
    entity, number and date swaps a perturbation makes and a summarizer gets wrong."""
    marked = [(s, e) for s, e, w in _absent(document, response) if any(c.isdigit() for c in w) or response[s].isupper()]
    return _per_token(response, offsets, marked)


def position(document: str, response: str, offsets: np.ndarray) -> np.ndarray:
    """Where the token starts, as a share of the response's length: a detector that merely flags late tokens (an
    invented sentence appended at the end) scores as well as this."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    return offsets[:, 0].astype(np.float64) / max(1, len(response))


@dataclass(frozen=True)
class Control:
    help: str
    score: Callable[[str, str, np.ndarray], np.ndarray]


LEXICAL = "lexical control"
CONTROLS: dict[str, Control] = {
    LEXICAL: Control("the token's word does not occur in the source document (1) or does (0)", absent_word),
    "new number or name": Control(
        "the token's word is a number or a capitalised word that does not occur in the document", absent_number_or_name
    ),
    "position": Control("the token's position in the response (0 first … 1 last): later looks worse", position),
}


def control_scores(document: str, response: str, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """Every control's score of each token of `response` (its character offsets, (n, 2)) against `document`."""
    return {name: c.score(document, response, offsets) for name, c in CONTROLS.items()}


def labelled_controls(
    documents: Sequence[str], responses: Sequence[str], offsets: Sequence[np.ndarray], gold: Sequence[np.ndarray]
) -> dict[str, np.ndarray]:
    """Each control over many records' tokens, kept where the gold label is known (≥ 0) and concatenated in record
    order: aligned with a detection table's arrays (transfer._token_arrays, token_scores.detection_auroc)."""
    out: dict[str, list[np.ndarray]] = {name: [] for name in CONTROLS}
    for document, response, off, g in zip(documents, responses, offsets, gold):
        keep = np.asarray(g) >= 0
        for name, values in control_scores(document, response, off).items():
            out[name].append(values[keep])
    return {name: np.concatenate(v) if v else np.zeros(0) for name, v in out.items()}
