"""Rendering: a word diff, text boxes, Plotly charts with a PNG download, CSV downloads. Tokens coloured by p(good)
or gold labels, and their legend, are the core's (topl_core.analysis.token_colors: token_html, legend_html)."""

from __future__ import annotations

import difflib
import html

import pandas as pd
import streamlit as st

BOX_CSS = """
<style>
.topl-diff-ins {background: #fde68a; border-radius: 3px; padding: 0 1px;}
.topl-diff-del {color: #9ca3af; text-decoration: line-through;}
.topl-box {border: 1px solid rgba(128,128,128,.35); border-radius: 8px; padding: .7rem .9rem; min-height: 6rem;
           line-height: 1.6; font-size: 1.02rem;}
</style>
"""


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
        BOX_CSS + f'<div style="font-weight:600;margin-bottom:.3rem">{html.escape(title)}</div>'
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
