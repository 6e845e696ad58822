"""The Steering page's cached work: the merged model with its steering vectors (one session per model spec, run
fingerprint, token set and k, shared read-only), the generations per λ (SteeredText: in a gated mode with what the
head took back) — streamed into the page as they are written, or generated ahead (the slider's neighbouring
positions, while the texts are read), then kept — the base model's text, each text's factuality and fluency, and the
export zip."""

from __future__ import annotations

import html
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import closing
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.models import MAX_MODELS, base_model, merged_model, resource_lock
from pages._ui.render import text_box
from pages._ui.token_sets import token_set
from topl_core.analysis.evaluation.quality import scorer_quality
from topl_core.analysis.evaluation.scorers import GroundingScorer, score_summary
from topl_core.analysis.evaluation.text import count_sentences
from topl_core.analysis.lora_a.probe import ProbeSettings
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.analysis.steering.fluency import fluency
from topl_core.analysis.steering.modes import SteerConfig
from topl_core.analysis.steering.prefetch import Prefetch, background_priority
from topl_core.analysis.steering.session import SteeringSession
from topl_core.analysis.steering.steered_text import SteeredText
from topl_core.analysis.steering.summary import ExportBundle, export_bundle
from topl_core.inference.generate import GenerationConfig, stream_generate

log = logging.getLogger(__name__)


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
    prefetch().cancel()  # the vectors are read with a forward on the merged model, which work ahead may be steering
    settings = ProbeSettings(random_control=False, precision=key.precision)
    with resource_lock(f"merged:{key.spec}:{key.run}"):  # the site outputs are read with a forward on the shared model
        vectors = build_steering_vectors(key.run, records, settings, top_k=key.top_k, merged=merged)
    session = SteeringSession(merged, vectors)
    if compiled_decode():
        session.compile_decode(wait=False)  # a compiled step once decode_warmer() has built it; eager until then
    return session


def compiled_decode() -> bool:
    """Whether the page builds and takes the compiled decode step (docs/app.md, "Steering"): TOPL_COMPILED_DECODE=0
    never, else (auto, the default) once built. On a CPU the step is built by a child process at the lowest priority
    (inference/exported_decode.py) and halves each decode step (SmolLM2 on a 2-core EPYC: 19.6–21.7 against 46–48 ms a
    token); the page's own streams go on eagerly meanwhile. On a GPU it is compiled here with CUDA graphs (Qwen3-8B
    on an H200: a steered summary in 0.48 s against 1.73 s)."""
    return os.environ.get("TOPL_COMPILED_DECODE", "auto") != "0"


@st.cache_data(show_spinner=False, max_entries=1024)
def steered_texts(
    key: SessionKey, gen: GenerationConfig, document: str, grid: tuple[float, ...], how: SteerConfig
) -> dict[float, SteeredText]:
    """The steered generation at every λ of `grid` (one λ, or the slider's every position), generated as one batch
    where the mode batches rows (SteeringSession.grid_generations; one λ alone is generate_steered's text)."""
    return dict(zip(grid, steering_session(key).grid_generations(document, grid, gen, how=how)))


class TextStore:
    """Every text generated on the page, by what it depends on (shared by the browser sessions; the least recently
    used dropped past `size`): a λ already seen is drawn at once, and a generation a reader left is not kept half."""

    def __init__(self, size: int = 4096):
        self._texts: OrderedDict[tuple, SteeredText] = OrderedDict()
        self._lock, self._size = threading.Lock(), size

    def get(self, key: tuple) -> SteeredText | None:
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
            return self._texts.get(key)

    def put(self, key: tuple, text: SteeredText, replace: bool = True) -> None:
        with self._lock:
            if replace or key not in self._texts:
                self._texts[key] = text
            while len(self._texts) > self._size:
                self._texts.popitem(last=False)


@st.cache_resource
def text_store() -> TextStore:
    return TextStore()


CURSOR = "▍"
AHEAD = "being written ahead…"  # a box whose text the page is generating ahead, until it is done


@st.cache_resource
def prefetch() -> Prefetch:
    """The page's work done ahead (one job for all browser sessions: they share the models and the cores)."""
    return Prefetch()


def written(placeholder, title: str, key: tuple, stream: Callable[[], Iterator[SteeredText]]) -> SteeredText:
    """The generation under `key`: from the store; or, when it is being generated ahead, once that is done; else
    streamed into `placeholder` token by token (what is generated ahead for another position is dropped first) and
    then stored. A new slider position reruns the page, which stops the stream at its next token (the reader has
    moved on)."""
    done = text_store().get(key)
    if done is not None:
        return done
    ahead = prefetch().writing(key)
    if ahead is not None:  # shown as it is written ahead; each draw lets a new slider move stop this run
        while not ahead.wait(0.1):
            so_far = prefetch().partial(key)
            body = _being_written(so_far.text) if so_far and so_far.text else f"<i>{AHEAD}</i>"
            placeholder.markdown(text_box(title, body, "writing…"), unsafe_allow_html=True)
        done = text_store().get(key)
        if done is not None:
            return done
    prefetch().cancel()
    g = SteeredText("")
    with closing(stream()) as parts:
        for g in parts:
            placeholder.markdown(text_box(title, _being_written(g.text), "writing…"), unsafe_allow_html=True)
    text_store().put(key, g)
    return g


def _being_written(text: str) -> str:
    return html.escape(text).replace("\n", "<br>") + CURSOR


def base_stream(spec: str, gen: GenerationConfig, document: str) -> Iterator[SteeredText]:
    """The base model's summary as it is written."""
    lm = base_model(spec)
    with resource_lock(f"base:{spec}"):
        for text in stream_generate(lm, document, gen):
            yield SteeredText(text)


def steered_stream(
    key: SessionKey, gen: GenerationConfig, document: str, lam: float, how: SteerConfig
) -> Iterator[SteeredText]:
    """The steered summary at λ as it is written (SteeringSession.stream_generations)."""
    yield from steering_session(key).stream_generations(document, lam, gen, how=how)


def generate_ahead(
    session: SteeringSession,
    document: str,
    lambdas: Sequence[float],
    gen: GenerationConfig,
    how: SteerConfig,
    key_of: Callable[[float], tuple],
) -> None:
    """Generate the λ positions of `lambdas` not generated yet as one batch in the background (Prefetch), into the
    store under key_of(λ): the slider's next move reads them (or their text so far) instead of generating while the
    person waits."""
    store = text_store()
    todo = [lam for lam in lambdas if store.get(key_of(lam)) is None]
    if todo:
        prefetch().start(
            [key_of(lam) for lam in todo],
            lambda cancel: session.stream_grid(document, todo, gen, how=how, cancel=cancel),
            lambda key, text: store.put(key, text, replace=False),
        )


class DecodeWarmer:
    """Builds the compiled decode step's graph for the page's document (SteeringSession.warm_decode) in a background
    thread once the work ahead is done, one graph at a time. Until it is built the page's streams decode eagerly, and
    a graph being built is never waited for: it cannot be stopped, so a move during it decodes eagerly beside it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._building: threading.Thread | None = None
        self._failed: weakref.WeakSet[SteeringSession] = weakref.WeakSet()  # logged once, not tried on every run

    def request(self, session: SteeringSession, document: str, gen: GenerationConfig, how: SteerConfig) -> None:
        """Build the graph of `document`'s length unless it is built or does not apply; while another is being built,
        nothing (both would compete for the cores): the page's next run asks again."""
        if session in self._failed or not session.compiles_decode(gen, how) or session.decode_ready(document, gen, how):
            return
        with self._lock:
            if self._building is None or not self._building.is_alive():
                args = (session, document, gen, how)
                self._building = threading.Thread(target=self._build, args=args, name="topl-decode-warmer", daemon=True)
                self._building.start()

    def _build(self, session: SteeringSession, document: str, gen: GenerationConfig, how: SteerConfig) -> None:
        background_priority()  # and the compiler processes it starts: a slider move during the build gets the cores
        while prefetch().busy():  # the neighbours first: they are what the next move reads
            time.sleep(0.2)
        try:
            t = time.perf_counter()
            session.warm_decode(document, gen, how)
            log.info("compiled decode step ready for this document after %.1f s", time.perf_counter() - t)
        except Exception:
            self._failed.add(session)
            log.exception("building the compiled decode step failed: the page decodes eagerly")


@st.cache_resource
def decode_warmer() -> DecodeWarmer:
    return DecodeWarmer()


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
