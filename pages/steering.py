"""Steering: a λ slider regenerates the summary with LoRA-B steering (v = scaling·B(μ+ − μ−) added at the
top-k residual-writing sites of the merged model). Base | merged | steered side by side with the changed words
highlighted; the sites used and their AUROC; the λ → factuality curve; export of the steering vectors.

Built for live demos: the merged model and the steering vectors are cached per (model spec, run fingerprint, token
set, k) with st.cache_resource and shared read-only (steering hooks act only on the generating thread); every
generated text is cached per λ, so dragging back to a λ already seen is instant."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import html
import io
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.models import MAX_MODELS, base_model, load_error, merged_model, resource_lock
from pages._ui.render import csv_download, diff_html, plot, text_box
from pages._ui.runs import run_fingerprint, run_picker
from pages._ui.spec import current_spec

try:  # the token sets are read with the analysis core too
    from pages._ui.token_sets import token_set, token_set_picker
    from topl_core.analysis.scorers import GroundingScorer, count_sentences, score_summary, scorer_quality
    from topl_core.analysis.steering import SteeringSession, build_steering_vectors
except ImportError as e:
    st.error(f"The analysis core is not available: {e}")
    st.stop()
from topl_core.generate import GenerationConfig, generate

st.title("Steering")
st.caption(
    "Push the merged model toward faithful (λ > 0) or hallucinated (λ < 0) summaries by adding "
    "λ · scaling · B(μ+ − μ−) to the outputs of the adapter's most separating sites."
)

spec = current_spec()
top = st.columns([2, 1, 1])
run = run_picker("Adapter", key="steer.run", default_method="topl", container=top[0])
if run is None:
    st.stop()
fp = run_fingerprint(run)
top_k = top[1].slider("Sites steered (top-k by AUROC)", 1, 8, 4, key="steer.top_k", persist_state="session")
max_new = top[2].slider("Max new tokens", 16, 160, 64, step=8, key="steer.max_new", persist_state="session")
with st.expander("Token set for μ+ / μ− and the site AUROCs", expanded=False):
    ts = token_set_picker("steer", run, default_limit=16)


@st.cache_resource(show_spinner="Computing steering vectors (projections cached on disk)…", max_entries=2 * MAX_MODELS)
def steering_session(spec: str, run: str, fp: str, ts: tuple, top_k: int) -> SteeringSession:
    """Merged model (shared, never mutated) + the run's steering vectors. One per (spec, run fingerprint, …)."""
    _, records = token_set(*ts)
    vectors = build_steering_vectors(run, records, top_k=top_k)
    return SteeringSession(merged_model(spec, run, fp), vectors)


@st.cache_data(show_spinner=False, max_entries=512)
def steered_text(spec: str, run: str, fp: str, ts: tuple, top_k: int, document: str, lam: float, max_new: int) -> str:
    sess = steering_session(spec, run, fp, ts, top_k)
    return sess.generate_steered(document, lam, GenerationConfig(max_new_tokens=max_new))


@st.cache_data(show_spinner=False, max_entries=128)
def base_text(spec: str, document: str, max_new: int) -> str:
    lm = base_model(spec)
    with resource_lock(f"base:{spec}"):
        return generate(lm, [document], GenerationConfig(max_new_tokens=max_new))[0]


@st.cache_resource
def scorer() -> GroundingScorer:
    return GroundingScorer()


@st.cache_data(show_spinner=False)
def scorer_caption() -> str:
    try:
        return scorer_quality(scorer()).summary()
    except Exception as e:  # quality could not be measured (no CLIFF/HaluEval): say so next to the scores
        return f"offline grounding scorer (quality not measured: {e})"


def fact(document: str, text: str) -> float:
    return score_summary(scorer(), document, text, "sentence").score


try:
    session = steering_session(spec, run, fp, ts, top_k)
except Exception as e:
    load_error(e)
    st.stop()
vec = session.vectors
lo, hi = (float(x) for x in vec.lambda_range)

# --- the document -----------------------------------------------------------------------------------------
src = st.radio("Document", ["From a data set", "Paste"], horizontal=True, key="steer.source", persist_state="session")
if src == "From a data set":
    c1, c2 = st.columns([3, 1])
    path = dataset_picker("steer.dataset", container=c1)
    if not path:
        st.stop()
    docs = list(dict.fromkeys(r.document for r in records_of(path)))
    i = c2.number_input(
        f"Document (of {len(docs)})", 0, len(docs) - 1, 0, key="steer.doc_index", persist_state="session"
    )
    document = docs[int(i)]
    with st.expander("Document text"):
        st.write(document)
else:
    document = st.text_area(
        "Document",
        height=180,
        key="steer.document",
        persist_state="session",
        value="The council of Leeds approved the new budget on Monday after a long debate. "
        "Police arrested two men in London and released a third. The company said profits "
        "increased by 12 percent in 2023.",
    )
if not document.strip():
    st.stop()

# --- λ and the three texts --------------------------------------------------------------------------------
RANGES = sorted({1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, max(abs(lo), abs(hi))})
c_lam, c_range = st.columns([6, 1], vertical_alignment="bottom")
bound = c_range.selectbox(
    "λ range ±",
    RANGES,
    index=RANGES.index(max(abs(lo), abs(hi))),
    key="steer.range",
    persist_state="session",
    format_func=lambda x: f"{x:g}",
    help="A briefly trained adapter has small steering vectors (see ‖v‖ below): widen the range until the text moves.",
)
lo, hi = -bound, bound
STEP = (hi - lo) / 16
GRID = [round(lo + i * STEP, 6) for i in range(17)]  # the slider's positions: warm them all for a live demo
lam = c_lam.slider(
    "λ  (← hallucinated · faithful →)",
    lo,
    hi,
    0.0,
    step=STEP,
    key="steer.lambda",
    persist_state="session",
    help="0 reproduces the merged model exactly. Every position is cached once generated: press "
    "'Generate every λ' below before a talk and dragging is instant.",
)
try:
    with st.spinner("Generating…"):
        t_base = base_text(spec, document, max_new)
        t_merged = steered_text(spec, run, fp, ts, top_k, document, 0.0, max_new)
        t_steered = steered_text(spec, run, fp, ts, top_k, document, round(float(lam), 6), max_new)
except Exception as e:
    load_error(e)
    st.stop()

cols = st.columns(3, gap="medium")
boxes = [
    ("Base model", t_base, t_base),
    ("Merged adapter (λ = 0)", t_merged, t_merged),
    (f"Steered (λ = {lam:+.2f})", t_steered, None),
]
for col, (title, text, _) in zip(cols, boxes):
    body = diff_html(t_merged, text) if title.startswith("Steered") else html.escape(text).replace("\n", "<br>")
    n_sent = count_sentences(text)
    words = len(text.split())
    cap = f"factuality {fact(document, text):.2f} · {n_sent} sentence{'s' if n_sent != 1 else ''} · {words} words"
    col.markdown(text_box(title, body or "<i>(empty)</i>", cap), unsafe_allow_html=True)
changed = t_steered != t_merged
summary = (
    "Highlighted: words that differ from the merged output; struck through: words it dropped."
    if changed
    else "Identical to the merged output at this λ."
)
st.markdown(
    f'<div id="steer-summary" data-lambda="{lam:.3f}" data-changed="{int(changed)}" style="opacity:.75">'
    f"{summary}</div>",
    unsafe_allow_html=True,
)
st.caption(f"Factuality: {scorer_caption()}")

# --- sites and vectors ------------------------------------------------------------------------------------
left, right = st.columns([1, 1], gap="large")
with left:
    st.subheader("Steered sites")
    norms = vec.norms()
    sites = pd.DataFrame(
        [
            {
                "site": s.key,
                "layer": s.layer,
                "module": s.module,
                "AUROC": vec.auroc[s.key],
                "scaling": vec.scaling[s.key],
                "‖v‖": norms[s.key],
            }
            for s in vec.sites
        ]
    )
    st.dataframe(
        sites,
        hide_index=True,
        key="steer.sites",
        column_config={c: st.column_config.NumberColumn(format="%.3f") for c in ("AUROC", "scaling", "‖v‖")},
    )
    st.caption(f"μ+ / μ− from {vec.n_good} good and {vec.n_bad} bad tokens ({token_set(*ts)[0]}).")
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as d:
        vec.save(d)
        with zipfile.ZipFile(buf, "w") as z:
            for f in Path(d).iterdir():
                z.write(f, f.name)
    st.download_button(
        "Export steering vectors (safetensors + JSON)",
        buf.getvalue(),
        file_name=f"steering-{Path(run).name}.zip",
        mime="application/zip",
        key="steer.export",
        icon=":material/download:",
    )

with right:
    st.subheader("λ → factuality")
    key = (run, fp, document[:200], top_k, max_new, bound)
    if st.button(
        f"Generate every λ ({len(GRID)} positions) for this document",
        key="steer.curve_go",
        icon=":material/show_chart:",
    ):
        st.session_state["steer.curve_for"] = key
    if st.session_state.get("steer.curve_for") == key:
        grid = GRID
        bar = st.progress(0.0, text="Generating over the λ grid…")
        rows = []
        for j, g in enumerate(grid):
            t = steered_text(spec, run, fp, ts, top_k, document, g, max_new)
            rows.append(
                {
                    "lambda": g,
                    "factuality": fact(document, t),
                    "sentences": count_sentences(t),
                    "words": len(t.split()),
                    "text": t,
                }
            )
            bar.progress((j + 1) / len(grid), text=f"λ = {g:+.2f}")
        bar.empty()
        curve = pd.DataFrame(rows)
        fig = go.Figure(
            go.Scatter(
                x=curve["lambda"],
                y=curve["factuality"],
                mode="lines+markers",
                customdata=curve["text"].str.slice(0, 120),
                hovertemplate="λ=%{x:.2f}<br>factuality %{y:.3f}<br>%{customdata}<extra></extra>",
            )
        )
        fig.add_vline(x=lam, line_dash="dot", line_color="#dc2626")
        fig.update_layout(xaxis_title="λ", yaxis_title="factuality (offline scorer)", height=300, yaxis_range=[0, 1.02])
        plot(fig, key="steer.curve")
        csv_download(curve, "lambda_curve.csv", key="steer.curve_csv")
    else:
        st.caption(
            "One summary per slider position (cached, so the slider is instant afterwards), scored by the "
            "offline factuality scorer."
        )
