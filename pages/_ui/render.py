"""Rendering: tokens colored by p(good) or gold labels, their legend, a word diff, text boxes, Plotly charts with a
PNG download, CSV downloads."""

from __future__ import annotations

import difflib
import html

import pandas as pd
import streamlit as st

from topl_core.analysis.token_colors import p_color

TOKEN_CSS = """
<style>
.topl-tokens {line-height: 2.1; font-size: 1.02rem; font-family: ui-sans-serif, system-ui, sans-serif;}
.topl-tok {border-radius: 3px; padding: 1px 0; white-space: pre-wrap;}
.topl-gold-bad {border-bottom: 3px solid #111; }
.topl-flag {outline: 1.5px solid #b91c1c; outline-offset: -1px;}
.topl-legend span {display:inline-block; padding: 0 .45em; margin-right: .4em; border-radius: 3px; font-size: .85rem;}
.topl-diff-ins {background: #fde68a; border-radius: 3px; padding: 0 1px;}
.topl-diff-del {color: #9ca3af; text-decoration: line-through;}
.topl-box {border: 1px solid rgba(128,128,128,.35); border-radius: 8px; padding: .7rem .9rem; min-height: 6rem;
           line-height: 1.6; font-size: 1.02rem;}
</style>
"""


def token_html(tokens, p_good=None, gold=None, threshold: float = 0.5, extra=None) -> str:
    """Tokens as colored spans. Background = head p(good) (when given), or gold labels alone; a black underline
    marks gold-bad tokens; a red outline marks tokens the head flags (p(good) < threshold). Hover shows values."""
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
        )  # no raw newline: it would end the HTML block
    return TOKEN_CSS + '<div class="topl-tokens">' + "".join(out) + "</div>"


def legend_html(with_head: bool = True) -> str:
    items = []
    if with_head:
        items += [
            f'<span style="background:{p_color(0.02)}">p(good) ≈ 0</span>',
            f'<span style="background:{p_color(0.4)}">0.4</span>',
            f'<span style="background:{p_color(0.7)}">0.7</span>',
            f'<span style="background:{p_color(0.99)}">≈ 1</span>',
            '<span style="border-bottom:3px solid #111">gold bad</span>',
            '<span style="outline:1.5px solid #b91c1c">flagged (below threshold)</span>',
        ]
    else:
        items += [
            '<span style="background:rgba(220,38,38,.55)">bad (hallucinated span)</span>',
            '<span style="background:rgba(22,163,74,.12)">good</span>',
        ]
    return TOKEN_CSS + '<div class="topl-legend">' + "".join(items) + "</div>"


def diff_html(reference: str, text: str) -> str:
    """`text` with the words that differ from `reference` highlighted (insertions) or struck through (deletions)."""
    a, b = reference.split(), text.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(html.escape(" ".join(b[j1:j2])))
            continue
        if op in ("delete", "replace") and i2 > i1:
            out.append(f'<span class="topl-diff-del">{html.escape(" ".join(a[i1:i2]))}</span>')
        if op in ("insert", "replace") and j2 > j1:
            out.append(f'<span class="topl-diff-ins">{html.escape(" ".join(b[j1:j2]))}</span>')
    return " ".join(out)


def text_box(title: str, body_html: str, caption: str = "") -> str:
    cap = f'<div style="opacity:.65;font-size:.8rem;margin-top:.35rem">{html.escape(caption)}</div>' if caption else ""
    return (
        TOKEN_CSS + f'<div style="font-weight:600;margin-bottom:.3rem">{html.escape(title)}</div>'
        f'<div class="topl-box">{body_html}</div>{cap}'
    )


def rho_text(value: float) -> str:
    """A correlation for a caption: two decimals, or "—" where it is undefined (too few points)."""
    return "—" if value != value else f"{value:.2f}"  # NaN is the one value unequal to itself


def csv_download(df: pd.DataFrame, name: str, key: str, label: str = "Download CSV", container=st) -> None:
    container.download_button(
        label, df.to_csv(index=False).encode(), file_name=name, mime="text/csv", key=key, icon=":material/download:"
    )


PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def plot(fig, key: str, container=st) -> None:
    """Plotly chart; its toolbar's camera button downloads a PNG (rendered by the browser, no kaleido needed)."""
    fig.update_layout(margin=dict(l=10, r=10, t=40, b=10))
    container.plotly_chart(fig, key=key, config=PLOTLY_CONFIG, width="stretch")
