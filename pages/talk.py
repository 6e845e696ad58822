"""Talk mode: the steering demo for a projector. A deck (an adapter, a steering mode, N documents, the mode's λ grid)
is prepared in the background beforehand — every λ position of every document generated and judged by the adapter's
own head (analysis/studies/deck.py) — so that here the λ slider only reads what is prepared. The view is the deck's
self-contained page (analysis/studies/deck_html.py), embedded: large type, the document collapsible, base | merged |
steered coloured by the head's p(good), the flagged share against λ beside factuality, previous / next document, keys
(← / → λ, PageUp / PageDown document, taken from the whole app window); a slider move is answered in the browser from
the inlined deck, with no Streamlit rerun. The same page downloads as one HTML file for a room without the app."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

from pathlib import Path

import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.forms import mode_settings, opening_values
from pages._ui.jobs import follow, job_failure, job_row, pick_job
from pages._ui.runs import run_fingerprint, run_picker
from pages._ui.spec import current_precision
from topl_core.analysis.studies.deck import HEAD_CHOICES, DeckConfig, deck_folders, decks_dir, is_shipped, read_deck
from topl_core.analysis.studies.deck_html import deck_html
from topl_core.data.split import split_records
from topl_core.foundations.errors import RunError
from topl_core.foundations.paths import inside
from topl_core.foundations.status import read_status
from topl_core.jobs import background, launchers
from topl_core.runtime.modes import MODES

K = "talk."

st.title("Talk mode")
st.caption(
    "Steering for an audience: prepare a deck once (every λ of every document generated and judged by the adapter's "
    "head), then drag λ on stage — each move is read from the deck, nothing is generated."
)
DECKS = decks_dir()


# --- a new deck ----------------------------------------------------------------------------------------------------
folders = deck_folders()
with st.expander("Prepare a new deck", expanded=not folders):
    run = run_picker("Adapter", key=K + "run", default_method="topl")
    if run is not None:
        a, b, c = st.columns([2, 1, 1])
        mode = a.radio(
            "Steering mode",
            list(MODES),
            horizontal=True,
            format_func=lambda m: MODES[m].label,
            key=K + "mode",
            persist_state="session",
        )
        fp = run_fingerprint(run)
        opens = opening_values(run, fp, mode)  # the adapter's recommended τ and λ (`recommend`), where it has them
        tau = {"tau": opens.tau} if opens.tau is not None else {}
        settings = mode_settings(st, MODES[mode].settings, K, tau)  # the mode's own: gated τ and k
        centre = MODES[mode].neutral  # the merged model: the grid is centred on it, reaching the recommended λ
        bound = b.number_input(
            "λ from −x to +x" if centre == 0 else f"λ from {centre:g} − x to {centre:g} + x",
            0.25,
            64.0,
            2.0 if opens.lam is None else max(2.0, round(abs(opens.lam - centre) * 4) / 4),
            0.25,
            key=K + "bound",
            persist_state="session",
        )
        steps = c.number_input("Positions each side", 1, 8, 2, key=K + "steps", persist_state="session")
        lambdas = tuple(round(centre + bound * i / steps, 6) for i in range(-steps, steps + 1))
        st.caption(f"Opens at {opens.source}.")
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
            n = b.number_input("Documents (test split)", 1, 12, 3, key=K + "n_docs", persist_state="session")
            if path:  # held-out documents, as `steer --deck` takes them
                test = split_records(records_of(path))["test"]
                documents = tuple(dict.fromkeys(r.document for r in test))[: int(n)]
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
                    run,
                    documents,
                    lambdas,
                    mode,
                    max_new_tokens=int(max_new),
                    head=head,
                    precision=current_precision(),
                    **settings,
                )
                folder = launchers.launch_deck(cfg, inside(DECKS, name, "Deck name"))
            except Exception as e:
                st.error(f"Could not start the deck: {e}")
            else:
                st.session_state[K + "deck"] = str(folder)
                st.rerun()

folders = deck_folders()
if not folders:
    st.info("No deck yet: prepare one above (or `python -m topl_core steer --run ADAPTER --deck DIR`).")
    st.stop()


def deck_label(path: str) -> str:
    return Path(path).name + (" (shipped with the demo adapters)" if is_shipped(Path(path)) else "")


chosen = Path(pick_job("Deck", [str(f) for f in folders], K + "deck", deck_label))


# --- preparing / failed ---------------------------------------------------------------------------------------------
def progress_panel(job: background.JobStatus | None) -> None:
    if job is None or not job.active:
        return
    left = f" · about {job.eta_s:.0f} s left" if job.eta_s is not None else ""
    text = f"Preparing the deck: {job.step} / {job.steps or '?'} summaries{left} · {job.current or ''}"
    job_row(job, K, job.fraction, text)


job = background.read_job(chosen)
try:
    deck = read_deck(chosen)
except RunError as e:  # its deck.json cannot be read: the message says what to do
    st.error(str(e))
    st.stop()
if job is not None and job.active:
    follow(chosen, K, progress_panel, every=1.5)
    st.stop()
if not deck.complete:
    state = job.state if job is not None else "not started"
    message = f"This deck is not complete ({deck.done} / {deck.total} summaries; {state})"
    if job is not None and job.state == "failed":
        job_failure(chosen, f"{message}: {job.error or 'see the log'}")
    else:
        st.warning(message + ". Resuming keeps every summary already made.")
    for note in deck.unreadable_notes("resuming makes its summaries again."):
        st.warning(note, icon=":material/broken_image:")
    if st.button("Resume preparing", key=K + "resume", icon=":material/play_arrow:"):
        launchers.resume_deck_job(chosen)
        st.rerun()
    st.stop()


# --- talk mode -------------------------------------------------------------------------------------------------------
# The view itself is the deck's self-contained HTML (analysis/studies/deck_html.py), embedded: a slider move is answered
# by the browser from the inlined deck in milliseconds, where a Streamlit rerun takes tenths of a second.
@st.cache_data(show_spinner=False, max_entries=8)
def talk_html(folder: str, stamp: float) -> str:
    """The deck's page with the keys taken from the whole app window, built once per change of its files."""
    return deck_html(read_deck(folder), keys_from_parent=True)


for note in read_status(chosen).get("redone", []):  # what the last preparation found unreadable and made again
    st.info(note, icon=":material/build:")
if not deck.has_head:  # the view says whose verdict the colours are; a deck without one is flagged here too
    st.warning(deck.head_note, icon=":material/visibility_off:")
stamp = max(f.stat().st_mtime for f in chosen.glob("*.json"))
st.iframe(talk_html(str(chosen), stamp), height="content")
a, b = st.columns([1, 3], vertical_alignment="center")
a.download_button(
    "Download the deck as one HTML file",
    lambda: deck_html(read_deck(chosen)),  # built on the click
    file_name=f"{chosen.name}.html",
    mime="text/html",
    key=K + "export",
    icon=":material/download:",
)
b.caption(
    f"{deck.config.how.label()} · {Path(deck.config.adapter).name} · {deck.config.max_new_tokens} new tokens at most "
    "· prepared summaries only. Keys: ← / → move λ, PageUp / PageDown (or p / n) switch document. The downloaded "
    "file opens in any browser with no server and no network, and behaves the same."
)
