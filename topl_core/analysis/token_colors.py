"""The one colour scale of the head's p(good), and the token overlay drawn with it: the Token overlay and Data pages,
talk mode, the offline deck export and a notebook (TokenOverlay renders itself as HTML in Jupyter) share it.

    p_color(p) -> str                  a token's background for p(good)
    scale_legend() -> str              the scale's legend swatches (the pages' legend and the deck export's)
    token_html(tokens, p_good=None, gold=None, threshold=FLAG_THRESHOLD, extra=None) -> str
    legend_html(with_head=True) -> str
    TokenOverlay.from_scores(scores)   TokenScores as a value that Jupyter shows coloured (its _repr_html_)
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ..foundations.presets import FLAG_THRESHOLD

if TYPE_CHECKING:  # annotations only: the colour scale stays a light import (pages, the deck export)
    from ..inference.token_scores import TokenScores

SCALE = ((0.02, "p(good) ≈ 0"), (0.4, "0.4"), (0.7, "0.7"), (0.99, "≈ 1"))  # the legend's swatches

TOKEN_CSS = """
<style>
.topl-tokens {line-height: 2.1; font-size: 1.02rem; font-family: ui-sans-serif, system-ui, sans-serif;}
.topl-tok {border-radius: 3px; padding: 1px 0; white-space: pre-wrap;}
.topl-gold-bad {border-bottom: 3px solid #111; }
.topl-flag {outline: 1.5px solid #b91c1c; outline-offset: -1px;}
.topl-legend span {display:inline-block; padding: 0 .45em; margin-right: .4em; border-radius: 3px; font-size: .85rem;}
</style>
"""


def p_color(p: float) -> str:
    """Background for p(good): red for likely hallucinated, fading to a light green for confident good."""
    if p < 0.5:
        a = 0.25 + 0.6 * (0.5 - p) / 0.5
        return f"rgba(220,38,38,{a:.2f})"
    a = 0.08 + 0.3 * (p - 0.5) / 0.5
    return f"rgba(22,163,74,{a:.2f})"


def scale_legend() -> str:
    """The colour scale's swatches as spans (styled by the container's legend class)."""
    return "".join(f'<span style="background:{p_color(p)}">{label}</span>' for p, label in SCALE)


def token_html(
    tokens: Sequence[str],
    p_good: Sequence[float] | None = None,
    gold: Sequence[int] | None = None,
    threshold: float = FLAG_THRESHOLD,
    extra: Mapping[str, Sequence[float]] | None = None,
) -> str:
    """Tokens as coloured spans, one per token. Background = head p(good) (when given), or gold labels alone (1 good,
    0 bad, -1 unknown); a black underline marks gold-bad tokens; a red outline marks tokens the head flags (p(good) <
    threshold). Hover shows the values, and those of `extra` ({name: one value per token})."""
    out = []
    for i, t in enumerate(tokens):
        classes, style, title = ["topl-tok"], "", []
        g = None if gold is None else int(gold[i])
        if p_good is not None:
            p = float(p_good[i])
            style = f"background:{p_color(p)};"
            title.append(f"p(good)={p:.3f}")
            if p < threshold:
                classes.append("topl-flag")
        elif g is not None and g >= 0:
            style = f"background:{'rgba(220,38,38,.55)' if g == 0 else 'rgba(22,163,74,.12)'};"
        if g is not None and g >= 0:
            title.append("gold: " + ("bad" if g == 0 else "good"))
            if g == 0 and p_good is not None:
                classes.append("topl-gold-bad")
        if extra is not None:
            title.extend(f"{k}={v[i]:.3f}" for k, v in extra.items())
        title.insert(0, repr(t))
        out.append(
            f'<span class="{" ".join(classes)}" style="{style}" title="{html.escape(" · ".join(title))}">'
            f"{html.escape(t).replace(chr(10), '<br>')}</span>"
        )  # no raw newline: it would end a Markdown HTML block
    return TOKEN_CSS + '<div class="topl-tokens">' + "".join(out) + "</div>"


def legend_html(with_head: bool = True) -> str:
    """The legend of token_html: the p(good) scale, gold bad and flagged; or (with_head=False) the gold colours."""
    if with_head:
        items = scale_legend() + (
            '<span style="border-bottom:3px solid #111">gold bad</span>'
            '<span style="outline:1.5px solid #b91c1c">flagged (below threshold)</span>'
        )
    else:
        items = (
            '<span style="background:rgba(220,38,38,.55)">bad (hallucinated span)</span>'
            '<span style="background:rgba(22,163,74,.12)">good</span>'
        )
    return TOKEN_CSS + '<div class="topl-legend">' + items + "</div>"


@dataclass(frozen=True)
class TokenOverlay:
    """A response's tokens with the head's p(good) (and gold labels where known), shown coloured in Jupyter.

    Example: ``TokenOverlay.from_scores(scorer.score_text(document, summary))`` as a cell's last line"""

    tokens: tuple[str, ...]
    p_good: tuple[float, ...]
    gold: tuple[int, ...] | None = None  # 1 good, 0 bad, -1 unknown; None: no token's label is known
    threshold: float = FLAG_THRESHOLD

    @classmethod
    def from_scores(cls, scores: TokenScores, threshold: float = FLAG_THRESHOLD) -> "TokenOverlay":
        gold = tuple(int(g) for g in scores.gold) if (np.asarray(scores.gold) >= 0).any() else None
        return cls(tuple(scores.tokens), tuple(float(p) for p in scores.p_good), gold, threshold)

    @property
    def flagged(self) -> int:
        """How many tokens the head flags (p(good) < threshold)."""
        return sum(p < self.threshold for p in self.p_good)

    def _repr_html_(self) -> str:
        caption = f"{self.flagged} of {len(self.tokens)} tokens flagged (p(good) < {self.threshold:g})"
        return (
            token_html(self.tokens, self.p_good, self.gold, self.threshold)
            + legend_html()
            + f'<div style="opacity:.7;font-size:.85rem">{html.escape(caption)}</div>'
        )
