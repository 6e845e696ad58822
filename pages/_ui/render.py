"""Rendering: a word diff, a gated generation's replaced tokens, text boxes, Plotly charts with a PNG download, CSV
downloads. Tokens coloured by p(good) or gold labels, and their legend, are the core's
(topl_core.analysis.token_colors: token_html, legend_html)."""

from __future__ import annotations

import difflib
import html

import pandas as pd
import streamlit as st

from topl_core.runtime.steered_text import SteeredText

BOX_CSS = """
<style>
.topl-diff-ins {background: #fde68a; border-radius: 3px; padding: 0 1px;}
.topl-diff-del {color: #9ca3af; text-decoration: line-through;}
.topl-replaced {background: #bbf7d0; border-radius: 3px; padding: 0 1px;}
.topl-box {border: 1px solid rgba(128,128,128,.35); border-radius: 8px; padding: .7rem .9rem; min-height: 6rem;
           line-height: 1.6; font-size: 1.02rem; overflow-wrap: anywhere;}
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


def _visible(token: str) -> str:
    """A token as HTML a reader sees struck through: a line break as ↵, a space as ␣ where it is all there is."""
    return html.escape(token if token.strip() else token.replace(" ", "␣")).replace("\n", "↵") or "∅"


def replaced_html(g: SteeredText) -> str:
    """A gated generation's text, each token the head took back struck through before the token that replaced it."""
    out, at = [], 0
    for r in g.replacements:
        out.append(html.escape(g.text[at : r.start]))
        out.append(f'<span class="topl-diff-del" title="p(good) {r.p_good:.2f}">{_visible(r.original)}</span>')
        out.append(f'<span class="topl-replaced">{html.escape(g.text[r.start : r.end])}</span>')
        at = r.end
    out.append(html.escape(g.text[at:]))
    return "".join(out).replace("\n", "<br>")


def steered_html(merged: str, g: SteeredText) -> str:
    """The steered box: where a gate decided (g.gate), the tokens it replaced; otherwise the words that differ from
    the merged text."""
    return replaced_html(g) if g.gate is not None else diff_html(merged, g.text)


def steered_summary(merged: str, g: SteeredText, lam: float) -> str:
    """The line under the three boxes: what the steered box marks (data-lambda, data-changed and data-replaced for
    the browser test)."""
    changed = g.text != merged
    if g.gate is not None:
        summary = (
            f"{len(g.replacements)} token(s) replaced: struck through, the tokens the adapter's head flagged (p(good) "
            "< τ); in green, what the steered regeneration wrote instead."
        )
    elif changed:
        summary = "Highlighted: words that differ from the merged output; struck through: words it dropped."
    else:
        summary = "Identical to the merged output at this λ."
    return (
        f'<div id="steer-summary" data-lambda="{lam:.3f}" data-changed="{int(changed)}" '
        f'data-replaced="{len(g.replacements)}" style="opacity:.75">{html.escape(summary)}</div>'
    )


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
