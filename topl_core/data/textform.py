"""Undo the tokenized text of older summarization releases (CNN/DM and XSum as CLIFF and AggreFact ship them),
so that a head trained on ordinary text does not read it as a different language, keeping labels exact.

What `detokenize` rewrites (nothing else changes; lower-cased text stays lower-cased):
- PTB brackets `-lrb-` `-rrb-` `-lsb-` `-rsb-` `-lcb-` `-rcb-` → ( ) [ ] { }, with the space inside them;
- PTB quotes ``` `` ``` and `''` → `"`;
- spaced hyphens between word characters ("30 - year - old" → "30-year-old");
- the space before a clitic ("do n't", "it 's", "we 're") and before , . ; : ! ? %; the space after $ before a digit.

The rewrite keeps a map from old to new character offsets, so spans of the old text move exactly onto the new.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .records import Span

_RULES: tuple[tuple[str, str], ...] = (
    (r"(?i:-lrb-) ?", "("),
    (r" ?(?i:-rrb-)", ")"),
    (r"(?i:-lsb-) ?", "["),
    (r" ?(?i:-rsb-)", "]"),
    (r"(?i:-lcb-) ?", "{"),
    (r" ?(?i:-rcb-)", "}"),
    (r"``|''", '"'),
    (r"(?<=\w) - (?=\w)", "-"),
    (r" (?=(?:'s|'re|'ve|'ll|'d|'m|n't)\b)", ""),
    (r" (?=[,.;:!?%])", ""),
    (r"(?<=\$) (?=\d)", ""),
)
_PATTERN = re.compile("|".join(f"({rule})" for rule, _ in _RULES))


@dataclass(frozen=True)
class Rewritten:
    """A rewritten text and, for every old offset p (0..len(old)), where it lands: `starts[p]` for a span starting
    at p, `ends[p]` for a span ending at p (an offset inside a rewritten region maps to the region's start / end)."""

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def span(self, span: Span) -> Span:
        return Span(self.starts[span.start], self.ends[span.end], span.kind)


def detokenize(text: str) -> Rewritten:
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    cursor = new_length = 0
    for m in _PATTERN.finditer(text):
        for _ in range(cursor, m.start()):  # kept characters map one to one
            starts.append(new_length)
            ends.append(new_length)
            new_length += 1
        pieces.append(text[cursor : m.start()])
        replacement = _RULES[m.lastindex - 1][1]
        region_start, region_end = new_length, new_length + len(replacement)
        starts += [region_start] * (m.end() - m.start())
        ends += [region_start] + [region_end] * (m.end() - m.start() - 1)
        pieces.append(replacement)
        new_length, cursor = region_end, m.end()
    for _ in range(cursor, len(text)):
        starts.append(new_length)
        ends.append(new_length)
        new_length += 1
    pieces.append(text[cursor:])
    starts.append(new_length)
    ends.append(new_length)
    return Rewritten("".join(pieces), tuple(starts), tuple(ends))
