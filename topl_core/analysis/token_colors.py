"""The one colour scale of the head's p(good): the Token overlay, talk mode and the offline deck export share it."""

from __future__ import annotations

FLAG_THRESHOLD = 0.5  # a token is "flagged" (the head doubts it) when p(good) is below this


def p_color(p: float) -> str:
    """Background for p(good): red for likely hallucinated, fading to a light green for confident good."""
    if p < 0.5:
        a = 0.25 + 0.6 * (0.5 - p) / 0.5
        return f"rgba(220,38,38,{a:.2f})"
    a = 0.08 + 0.3 * (p - 0.5) / 0.5
    return f"rgba(22,163,74,{a:.2f})"
