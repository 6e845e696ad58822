"""A prepared deck as one self-contained HTML file — talk mode where the app cannot run —, inline in Jupyter, and PNG
frames of it. This module sits above deck.py: it reads a Deck, and deck.py does not import it.

    deck_html(deck) -> str          texts, token colours and scores of every λ position inlined as JSON, a plain range
                                    slider and a few lines of JavaScript; no network, no external asset
    write_deck_html(deck, path) -> Path
    show_deck(deck) -> DeckView     the page inline in Jupyter, in a sandboxed iframe of its own
    write_frames(html_path, out_dir, lambdas, document=0) -> list[Path]
        PNG screenshots of the file at fixed λ positions (headless Chromium through Playwright; TOPL_CHROMIUM names
        the browser, default /usr/bin/chromium)

The page opens at the neutral λ of the first document; `#doc=I&lambda=L` in its address opens another position.
Keys: ← / → move λ, PageUp / PageDown (or p / n) switch document. The steered box carries data-lambda (the λ shown).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ...foundations.io import atomic_open
from ...foundations.presets import FLAG_THRESHOLD
from ...runtime.steered_text import SteeredText
from ..token_colors import p_color, scale_legend
from .deck import Deck, Summary

# the page may load nothing: only its own inline style and script run
NO_NETWORK = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
HALLUCINATED_END, FAITHFUL_END = "← hallucinated", "faithful →"

CSS = """
body {font-family: ui-sans-serif, system-ui, sans-serif; margin: 1.2rem 2rem; color: #111; background: #fff;}
h1 {font-size: 1.8rem; margin: 0 0 .3rem 0;}
.note {opacity: .7; font-size: .95rem; margin-bottom: .8rem;}
nav {display: flex; gap: 1rem; align-items: center; font-size: 1.2rem; margin: .6rem 0;}
button {font-size: 1.1rem; padding: .3rem .8rem; border-radius: 6px; border: 1px solid #999; background: #f5f5f5;}
details {font-size: 1.05rem; margin: .4rem 0 1rem 0;} summary {cursor: pointer; font-weight: 600;}
.slider {display: flex; align-items: center; gap: .8rem; font-size: 1.3rem; margin: .6rem 0 1rem 0;}
.slider input {flex: 1; height: 2rem;} .end {opacity: .75; white-space: nowrap;}
#lambda-value {font-weight: 700; min-width: 7rem; text-align: right;}
.cols {display: grid; grid-template-columns: 1fr 1fr 1fr; gap: 1.2rem;}
h2 {font-size: 1.3rem; margin: 0 0 .4rem 0;}
.box {border: 1px solid rgba(128,128,128,.35); border-radius: 8px; padding: .8rem 1rem; min-height: 8rem;
      font-size: 1.45rem; line-height: 1.75;}
.tok {border-radius: 3px; white-space: pre-wrap;} .flag {outline: 1.5px solid #b91c1c; outline-offset: -1px;}
.cap {opacity: .75; font-size: 1rem; margin-top: .4rem;}
del {color: #b91c1c;} ins {color: #15803d; text-decoration: none; font-weight: 600;}
.legend span {display: inline-block; padding: 0 .45em; margin-right: .4em; border-radius: 3px; font-size: .9rem;}
svg text {font-size: 12px; fill: #444;}
"""

SCRIPT = """
const D = JSON.parse(document.getElementById('deck-data').textContent);
const slider = document.getElementById('lambda');
let doc = 0;
const esc = s => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const pct = x => x === null ? 'n/a' : Math.round(100 * x) + '%';
function fill(id, s) {
  const box = document.getElementById(id);
  box.innerHTML = !s.text.trim() ? '<i>(empty)</i>' : s.tokens === null ? esc(s.text).replace(/\\n/g, '<br>')
    : s.tokens.map(([t, c, p]) => `<span class="tok${p < D.threshold ? ' flag' : ''}" style="background:${c}"` +
        ` title="p(good)=${p.toFixed(3)}">${esc(t).replace(/\\n/g, '<br>')}</span>`).join('');
  const quality = s.degenerate ? `DEGENERATE — ${s.degenerate}` : `factuality ${s.factuality.toFixed(2)}`;
  const gate = s.gate === null ? '' : `<br>${esc(s.gate)}` + s.replaced.map(([was, now]) =>
    ` <del>${esc(was)}</del>→<ins>${esc(now)}</ins>`).join('');
  document.getElementById(id + '-cap').innerHTML = esc(quality +
    (D.has_head && s.flagged_share !== null ? ` · flagged ${pct(s.flagged_share)} of tokens` : '')) + gate;
}
function curve(d, i) {
  const W = 520, H = 170, L = 40, R = 10, T = 10, B = 30, xs = D.lambdas, lo = xs[0], hi = xs[xs.length - 1];
  const x = v => L + (hi > lo ? (v - lo) / (hi - lo) : .5) * (W - L - R), y = v => T + (1 - v) * (H - T - B);
  const line = (key, color) => '<polyline fill="none" stroke-width="2.5" stroke="' + color + '" points="' +
    d.positions.map((s, j) => s[key] === null || (key === 'factuality' && s.degenerate) ? ''
      : x(xs[j]) + ',' + y(s[key])).join(' ') + '"/>';  // a degenerate text is not scored
  document.getElementById('curve').innerHTML =
    `<line x1="${L}" x2="${W - R}" y1="${y(0)}" y2="${y(0)}" stroke="#bbb"/>` +
    `<line x1="${x(xs[i])}" x2="${x(xs[i])}" y1="${T}" y2="${H - B}" stroke="#dc2626" stroke-dasharray="4"/>` +
    line('factuality', '#2563eb') + (D.has_head ? line('flagged_share', '#dc2626') : '') +
    `<text x="${L}" y="${H - 8}">λ ${lo}</text><text x="${W - R - 50}" y="${H - 8}">λ ${hi}</text>` +
    `<text x="4" y="${T + 10}">1</text><text x="4" y="${y(0)}">0</text>`;
}
function show() {
  const d = D.docs[doc], i = +slider.value, lam = D.lambdas[i];
  document.getElementById('doc-number').textContent = `Document ${doc + 1} / ${D.docs.length}`;
  document.getElementById('document').textContent = d.document;
  fill('base', d.base); fill('merged', d.positions[D.neutral]); fill('steered', d.positions[i]);
  const label = (lam >= 0 ? '+' : '') + lam.toFixed(2);
  document.getElementById('lambda-value').textContent = 'λ = ' + label;
  document.getElementById('steered-title').textContent = 'Steered (λ = ' + label + ')';
  document.getElementById('steered').dataset.lambda = lam;
  curve(d, i);
}
function go(step) { doc = (doc + step + D.docs.length) % D.docs.length; show(); }
slider.addEventListener('input', show);
document.getElementById('prev').onclick = () => go(-1);
document.getElementById('next').onclick = () => go(1);
function onKey(e) {
  if (e.key === 'PageDown' || e.key === 'n') { go(1); e.preventDefault(); }
  else if (e.key === 'PageUp' || e.key === 'p') { go(-1); e.preventDefault(); }
  else if ((e.key === 'ArrowRight' || e.key === 'ArrowLeft') && e.target !== slider) {
    slider.value = +slider.value + (e.key === 'ArrowRight' ? 1 : -1); show(); e.preventDefault();
  }
}
document.addEventListener('keydown', onKey);
const want = new URLSearchParams(location.hash.slice(1));
if (want.has('doc')) doc = Math.min(Math.max(+want.get('doc'), 0), D.docs.length - 1);
slider.value = want.has('lambda') ? D.lambdas.indexOf(+want.get('lambda')) : D.neutral;
if (+slider.value < 0) slider.value = D.neutral;
show();
"""


# Embedded in the app (talk mode), the page also takes the keys pressed anywhere in the app's window (not in a text
# field); the handler of a page no longer shown removes itself.
KEYS_FROM_PARENT = """
try {
  const top = window.parent.document;
  if (top.__toplDeckKeys) top.removeEventListener('keydown', top.__toplDeckKeys, true);
  const handler = e => {
    if (!slider.isConnected) { top.removeEventListener('keydown', handler, true); return; }
    if (['INPUT', 'TEXTAREA', 'SELECT'].includes(e.target.tagName) || e.target.isContentEditable) return;
    onKey(e);
  };
  top.__toplDeckKeys = handler;
  top.addEventListener('keydown', handler, true);
} catch (err) {}  // opened on its own, or the parent is another origin: the page's own keys only
"""


def _summary_json(s: Summary | None) -> dict:
    if s is None:
        return {
            "text": "(not prepared)",
            "factuality": 0.0,
            "flagged_share": None,
            "tokens": None,
            "degenerate": None,
            "gate": None,
            "replaced": [],
        }
    tokens = None if s.tokens is None else [[t, p_color(p), p] for t, p in zip(s.tokens, s.p_good)]
    return {
        "text": s.text,
        "factuality": s.factuality,
        "flagged_share": s.flagged_share,
        "tokens": tokens,
        "degenerate": s.degenerate,
        # a gated mode's take-backs: how many, and each token struck through with its replacement
        "gate": SteeredText(s.text, s.replacements, s.gate).note(),
        "replaced": [[r.original, r.replacement] for r in s.replacements],
    }


def deck_data(deck: Deck) -> dict:
    """Everything the page shows, per document and λ position."""
    cfg = deck.config
    return {
        "lambdas": list(cfg.lambdas),
        "neutral": cfg.lambdas.index(cfg.how.neutral),
        "threshold": FLAG_THRESHOLD,
        "has_head": deck.has_head,
        "docs": [
            {
                "document": d.document,
                "base": _summary_json(d.base),
                "positions": [_summary_json(d.at(lam)) for lam in cfg.lambdas],
            }
            for d in deck.documents
        ],
    }


def deck_html(deck: Deck, keys_from_parent: bool = False) -> str:
    """The page (module docstring); keys_from_parent: embedded in the app, take the keys of its window too."""
    cfg = deck.config
    data = json.dumps(deck_data(deck), ensure_ascii=False).replace("</", "<\\/")  # no "</script>" inside the JSON
    legend = scale_legend() + f'<span class="flag">flagged: p(good) &lt; {FLAG_THRESHOLD:g}</span>'
    title = f"Steering {Path(cfg.adapter).name} · {cfg.how.label()}"
    head = html.escape(deck.head_note)
    curve_caption = "blue: factuality (offline scorer)" + (" · red: flagged share" if deck.has_head else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta http-equiv="Content-Security-Policy" content="{NO_NETWORK}">
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<div class="note">{head}</div>
<div class="legend">{legend if deck.has_head else ""}</div>
<nav><button id="prev">← previous</button><span id="doc-number"></span><button id="next">next →</button>
<span class="note">keys: ← → λ · PageUp / PageDown document</span></nav>
<details><summary>Document</summary><p id="document"></p></details>
<div class="slider"><span class="end">{HALLUCINATED_END}</span>
<input type="range" id="lambda" min="0" max="{len(cfg.lambdas) - 1}" step="1" aria-label="lambda" list="ticks">
<datalist id="ticks">{"".join(f'<option value="{i}"></option>' for i in range(len(cfg.lambdas)))}</datalist>
<span class="end">{FAITHFUL_END}</span><span id="lambda-value"></span></div>
<div class="note">{html.escape(cfg.lambda_caption)}</div>
<div class="cols">
<section><h2>Base model</h2><div class="box" id="base"></div><div class="cap" id="base-cap"></div></section>
<section><h2>Merged adapter (λ = {cfg.how.neutral:g})</h2><div class="box" id="merged"></div>
<div class="cap" id="merged-cap"></div></section>
<section><h2 id="steered-title">Steered</h2><div class="box" id="steered"></div>
<div class="cap" id="steered-cap"></div></section>
</div>
<svg id="curve" width="520" height="170"></svg><div class="note">{curve_caption}, against λ</div>
<script type="application/json" id="deck-data">{data}</script>
<script>{SCRIPT}{KEYS_FROM_PARENT if keys_from_parent else ""}</script>
</body></html>
"""


@dataclass(frozen=True)
class DeckView:
    """A deck's page (deck_html) shown inline in Jupyter: its own document in a sandboxed iframe (scripts run, nothing
    reaches the notebook), so the slider, the keys and the λ curve work as in the exported file. show_deck makes
    one."""

    page: str
    height: int = 1040  # px: the page's three columns of 64-token summaries and its λ curve at a notebook's width

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.page)}" sandbox="allow-scripts" title="TOPL deck" '
            f'style="width:100%;height:{self.height}px;border:1px solid #ddd;border-radius:6px"></iframe>'
        )


def show_deck(deck: Deck, height: int = DeckView.height) -> DeckView:
    """Talk mode inline in Jupyter, from the same page as the offline export (deck_html).

    Example: ``show_deck(read_deck("runs/decks/my-talk"))`` as a notebook cell's last line shows talk mode inline"""
    return DeckView(deck_html(deck), height)


def write_deck_html(deck: Deck, path: str | Path) -> Path:
    with atomic_open(path) as f:
        f.write(deck_html(deck))
    return Path(path)


def write_frames(html_path: str | Path, out_dir: str | Path, lambdas, document: int = 0) -> list[Path]:
    """A PNG of the exported page per λ (a value of the deck's grid), for slides."""
    from playwright.sync_api import sync_playwright

    html_path, out_dir = Path(html_path).resolve(), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chromium = os.environ.get("TOPL_CHROMIUM", "/usr/bin/chromium")
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            for lam in lambdas:
                page = browser.new_page(viewport={"width": 1600, "height": 900})  # a fresh load reads the address
                page.goto(f"{html_path.as_uri()}#doc={document}&lambda={float(lam)}")
                shown = float(page.locator("#steered").get_attribute("data-lambda"))
                if shown != float(lam):
                    raise ValueError(f"λ = {lam:g} is not a position of this deck (its grid is in the page's slider).")
                path = out_dir / f"doc{document}-lambda{float(lam):+g}.png"
                page.screenshot(path=str(path), full_page=True)
                page.close()
                out.append(path)
        finally:
            browser.close()
    return out
