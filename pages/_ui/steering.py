"""The Steering page's cached work and its drawing: the merged model with its steering vectors (one session per model
spec, run fingerprint, token set and k, shared read-only), the slider of that session on a document — the core's
engine (topl_core/analysis/steering/slider.py: the texts per λ, the work ahead, the compiled step's warmer, the
streams), one per process — a text drawn into its box as it comes, each text's factuality and fluency, and the export
zip."""

from __future__ import annotations

import html
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Callable

import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.models import MAX_MODELS, base_model, load_error, merged_model, resource_lock, step_error
from pages._ui.render import text_box
from pages._ui.token_sets import token_set
from topl_core.analysis.evaluation.quality import scorer_quality
from topl_core.analysis.evaluation.scorers import GroundingScorer, score_summary
from topl_core.analysis.evaluation.text import count_sentences
from topl_core.analysis.lora_a.probe import ProbeSettings
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.analysis.steering.fluency import fluency
from topl_core.analysis.steering.slider import SliderView, shared_slider
from topl_core.analysis.steering.summary import ExportBundle, export_bundle
from topl_core.inference.generate import GenerationConfig
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.runtime.steered_text import SteeredText

CURSOR = "▍"  # the box is still being written
AHEAD = "being written ahead…"  # the box waits for the text the engine is writing ahead
# the most often a box being written is redrawn: each draw is a message the browser renders, on the cores that decode
# (docs/performance.md, "The slider on the page"); the first words are drawn at once, the finished text by the caller
REDRAW_S = 0.1
# the longest a text being written goes without a point where a waiting run of the page interrupts it: a draw, else
# an empty placeholder cleared (run_asked). Each is a message the browser renders on the cores that decode: clearing
# every 0.05 s besides the draws made a new λ's 64 tokens 0.2 s slower on the page (docs/performance.md, "The slider
# on the page")
INTERRUPTIBLE_S = 0.1
_last_point = threading.local()  # when this run's thread last wrote an element (its `at`: time.monotonic())


def generation(precision: str, decode: str, max_new: int) -> GenerationConfig:
    """How the page generates: greedy, `max_new` tokens, the prompt in `precision` and the decode steps in `decode`."""
    return GenerationConfig(max_new_tokens=max_new, precision=precision, decode_precision=decode)


@dataclass(frozen=True)
class SessionKey:
    """What the page's steering session is built from: the model spec, the adapter (its run and fingerprint), the
    token set for μ+ / μ− (token_sets.token_set's arguments), the k sites steered and the precision the vectors are
    read in. A key of the cached session, its texts and its export."""

    spec: str
    run: str
    fp: str
    ts: tuple
    top_k: int
    precision: str


@st.cache_resource(show_spinner="Computing steering vectors (projections cached on disk)…", max_entries=2 * MAX_MODELS)
def steering_session(key: SessionKey) -> SteeringSession:
    """Merged model (shared, never mutated) + the run's steering vectors, one per key."""
    _, records = token_set(*key.ts)
    merged = merged_model(key.spec, key.run, key.fp)
    settings = ProbeSettings(random_control=False, precision=key.precision)
    # the site outputs are read with a forward on the shared model, which the work ahead may be steering: it waits
    with shared_slider().paused(), resource_lock(f"merged:{key.spec}:{key.run}"):
        vectors = build_steering_vectors(key.run, records, settings, top_k=key.top_k, merged=merged)
    return SteeringSession(merged, vectors)


def slider_view(key: SessionKey, gen: GenerationConfig, document: str, how: SteerConfig) -> SliderView:
    """The session's slider on `document` (its texts, the work ahead, the compiled step asked for), read by this
    browser session: its next stream stops the one it has in flight."""
    reader = st.session_state.setdefault("steer.reader", uuid.uuid4().hex)
    session = steering_session(key)
    merged = (key.spec, key.run, key.fp)
    return shared_slider().view(key, session, document, gen, how, merged=merged, reader=reader, moved_on=run_asked())


def run_asked() -> Callable[[], bool]:
    """The reader's `moved_on` (slider.py): read by the engine at every decoder layer and token, so a text a person
    moved past (a slider move, a stop) stops at once, not at this run's next drawing — a prompt forward draws nothing
    for tenths of a second. Streamlit's own way: every element this run writes is a point where a new run or a stop
    waiting for it interrupts it (its StopException or RerunException, raised there; a rerun of a fragment only does
    not interrupt). While the engine writes from this run's thread, this clears an empty placeholder at most every
    INTERRUPTIBLE_S since this thread last wrote one (a box's draw is one too: `written`), which is such a point; it
    says False otherwise (another thread's forward is never interrupted)."""
    point, thread = st.empty(), threading.get_ident()

    def asked() -> bool:
        if threading.get_ident() == thread and time.monotonic() - getattr(_last_point, "at", 0.0) >= INTERRUPTIBLE_S:
            _last_point.at = time.monotonic()
            point.empty()  # where a new run of the page or its stop waits, Streamlit raises it here
        return False

    return asked


def opened_view(key: SessionKey, gen: GenerationConfig, document: str, how: SteerConfig) -> SliderView:
    """slider_view, after the merged model is loaded; a model that fails to load or vectors that cannot be computed
    are said in words, and the page stops."""
    try:
        merged_model(key.spec, key.run, key.fp)
    except Exception as e:
        load_error(e)
        st.stop()
    try:
        return slider_view(key, gen, document, how)
    except Exception as e:
        step_error(f"compute the steering vectors ({key.precision})", e)
        st.stop()


def base_texts(spec: str, gen: GenerationConfig, document: str) -> tuple[SteeredText | None, Callable]:
    """The base model's text if written, and its stream (as it is written; once written, drawn at once)."""
    slider = shared_slider()
    done = slider.base_text(spec, document, gen)
    return done, lambda: slider.base(spec, base_model(spec), document, gen, lock=resource_lock(f"base:{spec}"))


def written(boxes: list[tuple], done: SteeredText | None, parts: Callable, ahead: Callable) -> SteeredText:
    """`done` where it is written; else parts() (the text as it comes) drawn into every (placeholder, title) of `boxes`
    (two boxes show one text: the steered box at the neutral λ is the merged text) — its first words at once, then at
    most every REDRAW_S — the cursor after it (or, while ahead() says it is being written ahead and nothing is yet,
    so), and its last value. Each draw lets a new slider move stop this run."""
    if done is not None:
        return done
    g, drawn, shown = SteeredText(""), 0.0, ""
    with closing(parts()) as stream:
        for g in stream:
            if shown and time.monotonic() - drawn < REDRAW_S:  # words shown: the next draw waits a little
                continue
            drawn = _last_point.at = time.monotonic()  # also a point where a new run interrupts this one
            shown = g.text
            body = _being_written(g.text) if g.text or not ahead() else f"<i>{AHEAD}</i>"
            for placeholder, title in boxes:
                placeholder.markdown(text_box(title, body, "writing…"), unsafe_allow_html=True)
    return g


def _being_written(text: str) -> str:
    return html.escape(text).replace("\n", "<br>") + CURSOR


@st.cache_data(show_spinner="Writing the steering vectors and control vectors…", max_entries=16)
def export_zip(key: SessionKey) -> ExportBundle:
    """The Steering page's export (summary.export_bundle), built once per set of vectors."""
    sess = steering_session(key)
    return export_bundle(sess.vectors, sess.lm.model.config)


@st.cache_resource
def scorer() -> GroundingScorer:
    return GroundingScorer()


@st.cache_data(show_spinner=False)
def scorer_caption() -> str:
    try:
        return scorer_quality(scorer()).summary()
    except Exception as e:  # quality could not be measured (no CLIFF/HaluEval): say so next to the scores
        return f"offline grounding scorer (quality not measured: {e})"


@st.cache_data(show_spinner=False, max_entries=1024)
def fact(document: str, text: str) -> float:
    return score_summary(scorer(), document, text, "sentence").score


@st.cache_data(show_spinner=False, max_entries=1024)
def text_fluency(spec: str, text: str) -> dict:
    """Fluency of one text, perplexity under the base model (topl_core.analysis.steering.fluency)."""
    lm = base_model(spec)
    with resource_lock(f"base:{spec}"):
        return fluency([text], lm)[0].to_json()


def quality_caption(spec: str, document: str, g: SteeredText) -> str:
    """Factuality and fluency of a generation, or why it is degenerate (a broken text is damage, not "unfaithful"),
    and what a gate did to it."""
    return " · ".join(filter(None, [_quality(spec, document, g.text), g.note()]))


def _quality(spec: str, document: str, text: str) -> str:
    f = text_fluency(spec, text)
    n_sent = count_sentences(text)
    ppl = f"perplexity {f['perplexity']:.0f}" if f["perplexity"] is not None else "perplexity n/a"
    size = f"{n_sent} sentence{'s' if n_sent != 1 else ''} · {f['words']} words · {ppl}"
    if f["degenerate"]:
        return f"DEGENERATE — {f['reason']} · not scored for factuality · {size}"
    return f"factuality {fact(document, text):.2f} · {size} · distinct-2 {f['distinct_2']:.2f}"


def document_picker() -> str:
    """The document to steer: one of a data set's documents (by index), or pasted text."""
    src = st.radio(
        "Document", ["From a data set", "Paste"], horizontal=True, key="steer.source", persist_state="session"
    )
    if src == "Paste":
        return st.text_area(
            "Document",
            height=180,
            key="steer.document",
            persist_state="session",
            value="The council of Leeds approved the new budget on Monday after a long debate. "
            "Police arrested two men in London and released a third. The company said profits "
            "increased by 12 percent in 2023.",
        )
    c1, c2 = st.columns([3, 1])
    path = dataset_picker("steer.dataset", container=c1)
    if not path:
        st.stop()
    docs = list(dict.fromkeys(r.document for r in records_of(path)))
    i = c2.number_input(
        f"Document (of {len(docs)})", 0, len(docs) - 1, 0, key="steer.doc_index", persist_state="session"
    )
    with st.expander("Document text"):
        st.write(docs[int(i)])
    return docs[int(i)]
