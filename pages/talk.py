"""Talk mode: the steering demo for a projector. A deck (an adapter, a steering mode, N documents, the mode's λ grid)
is prepared in the background beforehand — every λ position of every document generated and judged by the adapter's
own head (topl_core.analysis.deck) — so that here the λ slider only reads files. Large type, the document
collapsible, base | merged | steered coloured by the head's p(good), the flagged share against λ beside factuality,
previous / next document, keys (← → λ once the slider has focus; PageUp / PageDown document), and the deck as one
self-contained HTML file for a room without the app."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import html
import time
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st
import streamlit.components.v1 as components

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.render import TOKEN_CSS, legend_html, plot, token_html
from pages._ui.runs import run_picker
from pages._ui.spec import current_precision
from topl_core import jobs
from topl_core.analysis.deck import (
    CONFIG_FILE,
    HEAD_CHOICES,
    Deck,
    DeckConfig,
    Summary,
    create_deck,
    decks_dir,
    read_deck,
)
from topl_core.analysis.deck_html import FAITHFUL_END, HALLUCINATED_END, deck_html
from topl_core.analysis.steering import MODES
from topl_core.analysis.token_colors import FLAG_THRESHOLD
from topl_core.paths import inside
from topl_core.status import read_status

K = "talk."
TALK_CSS = """
<style>
.talk-box .topl-tokens, .talk-box .talk-plain {font-size: 1.55rem; line-height: 1.8;}
.talk-title {font-size: 1.35rem; font-weight: 700; margin-bottom: .3rem;}
.talk-cap {font-size: 1.05rem; opacity: .8; margin-top: .3rem;}
.talk-ends {display: flex; justify-content: space-between; font-size: 1.15rem; opacity: .8;}
</style>
"""
# PageUp / PageDown (or p / n) press the document buttons; ← / → reach the λ slider once it has focus (Streamlit's
# slider takes arrow keys itself). The handler is replaced on every run: a removed frame's function must not linger.
KEYS_JS = """
<script>
const doc = window.parent.document;
if (doc.__toplTalkKeys) doc.removeEventListener('keydown', doc.__toplTalkKeys);
doc.__toplTalkKeys = e => {
  if (['INPUT', 'TEXTAREA'].includes(e.target.tagName)) return;
  const label = (e.key === 'PageDown' || e.key === 'n') ? 'Next document'
              : (e.key === 'PageUp' || e.key === 'p') ? 'Previous document' : null;
  const button = label && [...doc.querySelectorAll('button')].find(b => b.innerText.includes(label));
  if (button) { button.click(); e.preventDefault(); }
};
doc.addEventListener('keydown', doc.__toplTalkKeys);
</script>
"""

st.title("Talk mode")
st.caption(
    "Steering for an audience: prepare a deck once (every λ of every document generated and judged by the adapter's "
    "head), then drag λ on stage — each move is read from the deck, nothing is generated."
)
DECKS = decks_dir()


def deck_folders() -> list[Path]:
    """The decks under runs/decks/, newest first."""
    if not DECKS.is_dir():
        return []
    return sorted((d for d in DECKS.iterdir() if (d / CONFIG_FILE).exists()), key=lambda d: -d.stat().st_mtime)


def prepare_args(cfg: DeckConfig, folder: Path) -> list[str]:
    return ["steer", "--run", cfg.adapter, "--deck", str(folder), "--precision", cfg.precision]


# --- a new deck ----------------------------------------------------------------------------------------------------
folders = deck_folders()
with st.expander("Prepare a new deck", expanded=not folders):
    run = run_picker("Adapter", key=K + "run", default_method="topl")
    if run is not None:
        a, b, c = st.columns([2, 1, 1])
        mode = a.radio("Steering mode", MODES, horizontal=True, key=K + "mode", persist_state="session")
        bound = b.number_input(
            "λ from −x to +x" if mode != "conditional" else "λ from 1 − x to 1 + x",
            0.25,
            64.0,
            2.0,
            0.25,
            key=K + "bound",
            persist_state="session",
        )
        steps = c.number_input("Positions each side", 1, 8, 2, key=K + "steps", persist_state="session")
        centre = 1.0 if mode == "conditional" else 0.0
        lambdas = tuple(round(centre + bound * i / steps, 6) for i in range(-steps, steps + 1))
        a, b, c = st.columns([2, 1, 1])
        source = a.radio("Documents", ["From a data set", "Paste"], horizontal=True, key=K + "source")
        head = b.selectbox(
            "Head's verdict",
            HEAD_CHOICES,
            key=K + "head",
            help="auto: the run's own head where it has one (TOPL); probe: a probe head fitted on the adapter's "
            "hidden states (about two minutes on SmolLM2); none: texts only.",
        )
        max_new = c.number_input("Max new tokens", 8, 160, 48, 8, key=K + "max_new", persist_state="session")
        documents: tuple[str, ...] = ()
        if source == "From a data set":
            a, b = st.columns([3, 1])
            path = dataset_picker(K + "dataset", container=a)
            n = b.number_input("Documents", 1, 12, 3, key=K + "n_docs", persist_state="session")
            if path:
                documents = tuple(dict.fromkeys(r.document for r in records_of(path)))[: int(n)]
        else:
            pasted = st.text_area("Documents, separated by a line holding only ---", height=160, key=K + "pasted")
            documents = tuple(d.strip() for d in pasted.split("\n---\n") if d.strip())
        a, b = st.columns([3, 1], vertical_alignment="bottom")
        name = a.text_input("Deck name", f"{Path(run).name}-{mode}", key=K + "name")
        st.caption(
            f"{len(documents)} document(s) × ({len(lambdas)} λ positions + the base model) = "
            f"{len(documents) * (len(lambdas) + 1)} summaries; SmolLM2 takes a few seconds each on a 2-core CPU."
        )
        if b.button("Prepare", key=K + "prepare", icon=":material/play_arrow:", disabled=not documents):
            try:
                cfg = DeckConfig(
                    run, documents, lambdas, mode, max_new_tokens=int(max_new), head=head, precision=current_precision()
                )
                folder = create_deck(inside(DECKS, name, "Deck name"), cfg)
                jobs.launch(prepare_args(cfg, folder), folder, kind="deck")
            except Exception as e:
                st.error(f"Could not start the deck: {e}")
            else:
                st.session_state[K + "deck"] = str(folder)
                st.rerun()

folders = deck_folders()
if not folders:
    st.info("No deck yet: prepare one above (or `python -m topl_core steer --run ADAPTER --deck DIR`).")
    st.stop()
paths = [str(f) for f in folders]
if st.session_state.get(K + "deck") not in paths:
    st.session_state[K + "deck"] = paths[0]
chosen = Path(st.selectbox("Deck", paths, key=K + "deck", format_func=lambda p: Path(p).name))


# --- preparing / failed ---------------------------------------------------------------------------------------------
def progress_panel() -> None:
    job = jobs.read_job(chosen)
    active = job is not None and job.active
    if st.session_state.get(K + "was_active") and not active:
        st.session_state[K + "was_active"] = False
        st.rerun(scope="app")
    st.session_state[K + "was_active"] = active
    if not active:
        return
    status = read_status(chosen)
    eta = status.get("eta_s")
    left = f" · about {eta:.0f} s left" if eta is not None else ""
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    c1.progress(
        job.fraction,
        text=f"Preparing the deck: {job.step} / {job.steps or '?'} summaries{left} · {status.get('current') or ''}",
    )
    if c2.button("Stop", key=K + "stop", icon=":material/stop:"):
        jobs.cancel(chosen)


job = jobs.read_job(chosen)
deck = read_deck(chosen)
if job is not None and job.active:
    st.fragment(progress_panel, run_every=1.5)()
    st.stop()
if not deck.complete:
    state = job.state if job is not None else "not started"
    message = f"This deck is not complete ({deck.done} / {deck.total} summaries; {state})"
    if job is not None and job.state == "failed":
        st.error(f"{message}: {job.error or 'see the log'}")
        st.code(jobs.log_tail(chosen, 20) or "(empty log)", language=None)
    else:
        st.warning(message + ". Resuming keeps every summary already made.")
    if st.button("Resume preparing", key=K + "resume", icon=":material/play_arrow:"):
        jobs.launch(prepare_args(deck.config, chosen), chosen, kind="deck")
        st.rerun()
    st.stop()


# --- talk mode -------------------------------------------------------------------------------------------------------
def box(title: str, s: Summary) -> str:
    if not s.text.strip():
        body = '<div class="talk-plain"><i>(empty)</i></div>'
    elif s.tokens is None:
        body = f'<div class="talk-plain">{html.escape(s.text).replace(chr(10), "<br>")}</div>'
    else:
        body = token_html(s.tokens, p_good=s.p_good, threshold=FLAG_THRESHOLD)
    flagged = f" · flagged {s.flagged_share:.0%} of tokens" if s.flagged_share is not None else ""
    return (
        f'{TOKEN_CSS}{TALK_CSS}<div class="talk-title">{html.escape(title)}</div>'
        f'<div class="topl-box talk-box">{body}</div>'
        f'<div class="talk-cap">factuality {s.factuality:.2f}{flagged}</div>'
    )


def curve_figure(d: Deck, index: int, lam: float) -> go.Figure:
    rows = d.curve(index)
    fig = go.Figure()
    x = [r["lambda"] for r in rows]
    fig.add_trace(go.Scatter(x=x, y=[r["factuality"] for r in rows], name="factuality", mode="lines+markers"))
    if d.has_head:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[r["flagged_share"] for r in rows],
                name="flagged share (head)",
                mode="lines+markers",
                line=dict(color="#dc2626"),
            )
        )
    fig.add_vline(x=lam, line_dash="dot", line_color="#dc2626")
    fig.update_layout(
        height=260, xaxis_title="λ", yaxis=dict(range=[-0.05, 1.05]), legend=dict(orientation="h", y=-0.35)
    )
    return fig


cfg = deck.config
n_docs = len(deck.documents)
index = int(st.session_state.get(K + "doc", 0)) % n_docs
if deck.has_head:
    st.caption(deck.head_note)
    st.markdown(legend_html(), unsafe_allow_html=True)
else:
    st.warning(deck.head_note, icon=":material/visibility_off:")
prev, where, nxt = st.columns([1, 2, 1], vertical_alignment="center")
if prev.button("Previous document", key=K + "prev", icon=":material/arrow_back:", width="stretch"):
    st.session_state[K + "doc"] = index = (index - 1) % n_docs
if nxt.button("Next document", key=K + "next", icon=":material/arrow_forward:", width="stretch"):
    st.session_state[K + "doc"] = index = (index + 1) % n_docs
where.markdown(
    f"<div style='text-align:center;font-size:1.3rem'>Document {index + 1} / {n_docs}</div>", unsafe_allow_html=True
)
doc = deck.documents[index]
with st.expander("Document"):
    st.markdown(f"<div style='font-size:1.2rem'>{html.escape(doc.document)}</div>", unsafe_allow_html=True)

t0 = time.perf_counter()
lam = st.select_slider(
    f"λ   ({HALLUCINATED_END}  ·  {FAITHFUL_END})",
    options=list(cfg.lambdas),
    value=cfg.how.neutral,
    key=K + f"lambda.{chosen.name}",
    format_func=lambda x: f"{x:+g}",
    help=cfg.lambda_caption,
)
st.markdown(
    f'{TALK_CSS}<div class="talk-ends"><span>{HALLUCINATED_END}</span><span>{html.escape(cfg.lambda_caption)}'
    f"</span><span>{FAITHFUL_END}</span></div>",
    unsafe_allow_html=True,
)
cols = st.columns(3, gap="medium")
for col, (title, s) in zip(
    cols,
    [
        ("Base model", doc.base),
        (f"Merged adapter (λ = {cfg.how.neutral:g})", doc.at(cfg.how.neutral)),
        (f"Steered (λ = {lam:+g})", doc.at(lam)),
    ],
):
    col.markdown(box(title, s), unsafe_allow_html=True)
st.markdown(
    f'<div id="talk-state" data-doc="{index}" data-lambda="{lam}" data-render-ms="'
    f'{1000 * (time.perf_counter() - t0):.1f}"></div>',
    unsafe_allow_html=True,
)
left, right = st.columns([2, 1])
with left:
    plot(curve_figure(deck, index, lam), key=K + "curve")
with right:
    st.download_button(
        "Download the deck as one HTML file",
        deck_html(deck),
        file_name=f"{chosen.name}.html",
        mime="text/html",
        key=K + "export",
        icon=":material/download:",
        help="Opens in any browser with no server and no network: the same slider, keys and colours.",
    )
    st.caption(
        f"{cfg.how.label()} · {Path(cfg.adapter).name} · {cfg.max_new_tokens} new tokens at most · prepared "
        "summaries only (change the deck to change what is shown). Keys: PageUp / PageDown switch document; click "
        "the slider once, then ← / → move λ."
    )
components.html(KEYS_JS, height=0)
