"""Steering: a λ slider regenerates the summary with the merged model steered in one of the registered modes
(topl_core/analysis/steering/modes.py: LoRA-B's vector v = scaling·B(μ+ − μ−) at the top-k residual-writing sites
(the paper), the adapter's own update scaled by λ, two controls with the vector's norm) — on every position or only
on generated tokens. Base | merged | steered side by side with the changed words highlighted,
factuality and fluency under each (a degenerate text is marked as such); the sites used; the λ curve of
factuality and fluency; export of the vectors (safetensors + JSON, llama.cpp control vector).

Built for live demos: the merged model and the steering vectors are cached per (model spec, run fingerprint, token
set, k) with st.cache_resource and shared read-only (steering hooks act only on the generating thread); every
generated text is cached per λ, so dragging back to a λ already seen is instant."""

from pages._ui.frame import core_imports, ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import html
import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.models import MAX_MODELS, base_model, load_error, merged_model, resource_lock, step_error
from pages._ui.render import csv_download, diff_html, plot, text_box
from pages._ui.runs import run_fingerprint, run_picker
from pages._ui.spec import current_precision, current_spec

with core_imports():  # the token sets are read with the analysis core too
    from pages._ui.token_sets import token_set, token_set_picker
    from topl_core.analysis.evaluation.lambda_study import document_curve
    from topl_core.analysis.evaluation.quality import scorer_quality
    from topl_core.analysis.evaluation.scorers import GroundingScorer, score_summary
    from topl_core.analysis.evaluation.text import count_sentences
    from topl_core.analysis.lora_a.probe import ProbeSettings
    from topl_core.analysis.steering.fluency import fluency
    from topl_core.analysis.steering.modes import MODES, SteerConfig
    from topl_core.analysis.steering.session import SteeringSession
    from topl_core.analysis.steering.vectors import build_steering_vectors
from topl_core.generate import GenerationConfig, generate

st.title("Steering")
st.caption(
    "Push the merged model toward faithful (λ > 0) or hallucinated (λ < 0) summaries by adding "
    "λ · scaling · B(μ+ − μ−) to the outputs of the adapter's most separating sites — or scale the adapter's own "
    "update, or compare with two controls of the same norm."
)
spec, precision = current_spec(), current_precision()
top = st.columns([2, 1, 1])
run = run_picker("Adapter", key="steer.run", default_method="topl", container=top[0])
if run is None:
    st.stop()
fp = run_fingerprint(run)
top_k = top[1].slider("Sites steered (top-k by AUROC)", 1, 8, 4, key="steer.top_k", persist_state="session")
max_new = top[2].slider("Max new tokens", 16, 160, 64, step=8, key="steer.max_new", persist_state="session")
c_mode, c_pos = st.columns([3, 1], vertical_alignment="bottom")
mode = c_mode.radio(
    "How λ steers",
    list(MODES),
    horizontal=True,
    format_func=lambda m: MODES[m].label,
    key="steer.mode",
    persist_state="session",
    help=" ".join(f"**{m.label}**: {m.help}" for m in MODES.values()),
)
generated_only = c_pos.toggle(
    "Only generated tokens",
    False,
    key="steer.generated_only",
    persist_state="session",
    help="Leave the prompt (the document) untouched and steer only the tokens the model writes.",
)
how = SteerConfig(mode, "generated" if generated_only else "all")
with st.expander("Token set for μ+ / μ− and the site AUROCs", expanded=False):
    ts = token_set_picker("steer", run, default_limit=16)


@st.cache_resource(show_spinner="Computing steering vectors (projections cached on disk)…", max_entries=2 * MAX_MODELS)
def steering_session(spec: str, run: str, fp: str, ts: tuple, top_k: int, precision: str) -> SteeringSession:
    """Merged model (shared, never mutated) + the run's steering vectors. One per (spec, run fingerprint, …)."""
    _, records = token_set(*ts)
    merged = merged_model(spec, run, fp)
    settings = ProbeSettings(random_control=False, precision=precision)
    with resource_lock(f"merged:{spec}:{run}"):  # the site outputs are read with a forward on the shared model
        vectors = build_steering_vectors(run, records, settings, top_k=top_k, merged=merged)
    return SteeringSession(merged, vectors)


@st.cache_data(show_spinner=False, max_entries=1024)
def steered_texts(
    spec: str,
    run: str,
    fp: str,
    ts: tuple,
    top_k: int,
    precision: str,
    document: str,
    grid: tuple[float, ...],
    max_new: int,
    how: SteerConfig,
) -> dict[float, str]:
    """The steered text at every λ of `grid` (one λ, or the slider's every position), generated as one batch
    (SteeringSession.generate_grid; one λ alone is generate_steered's text)."""
    sess = steering_session(spec, run, fp, ts, top_k, precision)
    gen = GenerationConfig(max_new_tokens=max_new, precision=precision)
    return dict(zip(grid, sess.generate_grid(document, grid, gen, how=how)))


@st.cache_data(show_spinner=False, max_entries=128)
def base_text(spec: str, precision: str, document: str, max_new: int) -> str:
    lm = base_model(spec)
    with resource_lock(f"base:{spec}"):
        return generate(lm, [document], GenerationConfig(max_new_tokens=max_new, precision=precision))[0]


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


@st.cache_data(show_spinner=False, max_entries=1024)
def text_fluency(spec: str, text: str) -> dict:
    """Fluency of one text, perplexity under the base model (topl_core.analysis.steering.fluency)."""
    lm = base_model(spec)
    with resource_lock(f"base:{spec}"):
        return fluency([text], lm)[0].to_json()


def quality_caption(document: str, text: str) -> str:
    """Factuality and fluency of a text, or why it is degenerate (a broken text is damage, not "unfaithful")."""
    f = text_fluency(spec, text)
    n_sent = count_sentences(text)
    ppl = f"perplexity {f['perplexity']:.0f}" if f["perplexity"] is not None else "perplexity n/a"
    size = f"{n_sent} sentence{'s' if n_sent != 1 else ''} · {f['words']} words · {ppl}"
    if f["degenerate"]:
        return f"DEGENERATE — {f['reason']} · not scored for factuality · {size}"
    return f"factuality {fact(document, text):.2f} · {size} · distinct-2 {f['distinct_2']:.2f}"


try:
    merged_model(spec, run, fp)
except Exception as e:
    load_error(e)
    st.stop()
try:
    session = steering_session(spec, run, fp, ts, top_k, precision)
except Exception as e:
    step_error(f"compute the steering vectors ({precision})", e)
    st.stop()
vec = session.vectors

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
spec_mode = how.spec
if spec_mode.range_choices:
    c_lam, c_range = st.columns([6, 1], vertical_alignment="bottom")
    default_bound = spec_mode.lambda_range[1]
    bound = c_range.selectbox(
        "λ range ±",
        spec_mode.range_choices,
        index=spec_mode.range_choices.index(default_bound),
        key=f"steer.range.{spec_mode.family}",
        persist_state="session",
        format_func=lambda x: f"{x:g}",
        help="In normalised units; the raw λ of the paper's formula is shown under the slider.",
    )
else:
    c_lam, bound = st.container(), None
lo, hi, STEP = spec_mode.slider(bound)
neutral = spec_mode.neutral
GRID = spec_mode.slider_positions(bound)
lam = c_lam.slider(
    "λ  (← hallucinated · faithful →)",
    lo,
    hi,
    neutral,
    step=STEP,
    key=f"steer.lambda.{spec_mode.family}",
    persist_state="session",
    help=spec_mode.lambda_help
    + " Every position is cached once generated: press 'Generate every λ' below before a talk and "
    "dragging is instant.",
)
unit_note = spec_mode.action.unit_note(vec, spec_mode, how.units, lam)
if unit_note:
    st.caption(unit_note)
curve_key = (run, fp, document[:200], top_k, max_new, bound, how)  # the λ grid asked for ("Generate every λ")


def steered_at(value: float) -> str:
    """The steered text at λ = value: from this document's λ grid once it was generated (one batch), else alone."""
    if st.session_state.get("steer.curve_for") == curve_key:
        texts = steered_texts(spec, run, fp, ts, top_k, precision, document, tuple(GRID), max_new, how)
        if value in texts:
            return texts[value]
    return steered_texts(spec, run, fp, ts, top_k, precision, document, (value,), max_new, how)[value]


try:
    with st.spinner("Generating…"):
        t_base = base_text(spec, precision, document, max_new)
        t_merged = steered_at(neutral)
        t_steered = steered_at(round(float(lam), 6))
except Exception as e:
    step_error(f"generate the summaries ({precision})", e)
    st.stop()

cols = st.columns(3, gap="medium")
boxes = [
    ("Base model", t_base, t_base),
    (f"Merged adapter (λ = {neutral:g})", t_merged, t_merged),
    (f"Steered ({spec_mode.label}, λ = {lam:+.2f})", t_steered, None),
]
for col, (title, text, _) in zip(cols, boxes):
    body = diff_html(t_merged, text) if title.startswith("Steered") else html.escape(text).replace("\n", "<br>")
    col.markdown(text_box(title, body or "<i>(empty)</i>", quality_caption(document, text)), unsafe_allow_html=True)
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
st.caption(
    f"Factuality: {scorer_caption()}. Fluency: perplexity under the base model, distinct-2; a text is marked "
    "degenerate when it repeats itself, turns into non-words or is empty (thresholds: "
    "topl_core/analysis/steering/fluency.py)."
)

# --- sites and vectors ------------------------------------------------------------------------------------
left, right = st.columns([1, 1], gap="large")
with left:
    st.subheader("Steered sites")
    norms = vec.norms()
    raw_factor = vec.unit_factor("vector")
    sites = pd.DataFrame(
        [
            {
                "site": s.key,
                "AUROC": vec.auroc[s.key],
                "scaling": vec.scaling[s.key],
                "‖v‖": norms[s.key],
                "mean ‖output‖": vec.output_norm[s.key],
                "‖diff-mean‖": float(np.linalg.norm(vec.diff_mean[s.key])),
                "cos(v, diff-mean)": float(
                    vec.vectors[s.key]
                    @ vec.diff_mean[s.key]
                    / max(norms[s.key] * float(np.linalg.norm(vec.diff_mean[s.key])), 1e-30)
                ),
                "raw λ per unit": raw_factor[s.key],
            }
            for s in vec.sites
        ]
    )
    st.dataframe(
        sites,
        hide_index=True,
        key="steer.sites",
        column_config={c: st.column_config.NumberColumn(format="%.3f") for c in sites.columns if c != "site"},
    )
    st.caption(
        f"μ+ / μ− and the site outputs from {vec.n_good} good and {vec.n_bad} bad tokens ({token_set(*ts)[0]}). "
        "Modes that scale the adapter's update act on every LoRA site of the adapter, not only these."
    )
    config = session.lm.model.config
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as d:
        vec.save(d)
        for m in (
            m.name for m in MODES.values() if m.exportable
        ):  # llama-cli --control-vector-scaled FILE λ steers like normalised λ here
            left_out = vec.save_control_vector(
                Path(d) / f"{m}.gguf", m, "normalised", config.model_type, config.num_hidden_layers
            )
        with zipfile.ZipFile(buf, "w") as z:
            for f in sorted(Path(d).iterdir()):
                z.write(f, f.name)
    st.download_button(
        "Export steering vectors (safetensors + JSON, llama.cpp control vectors)",
        buf.getvalue(),
        file_name=f"steering-{Path(run).name}.zip",
        mime="application/zip",
        key="steer.export",
        icon=":material/download:",
        help="vector.gguf / diff-mean.gguf hold λ = 1 in normalised units: `llama-cli -m MODEL.gguf "
        "--control-vector-scaled vector.gguf 2` steers like λ = 2 here (an o_proj vector is added at the end of its "
        "layer: an approximation). steering_vectors.safetensors + steering.json hold the raw vectors of the paper's "
        "formula and the per-site factors."
        + (
            f" Left out of the .gguf files: {', '.join(left_out)} (llama.cpp has no direction for layer 0)."
            if left_out
            else ""
        ),
    )

with right:
    st.subheader("λ → factuality and fluency")
    if st.button(
        f"Generate every λ ({len(GRID)} positions) for this document",
        key="steer.curve_go",
        icon=":material/show_chart:",
    ):
        st.session_state["steer.curve_for"] = curve_key
    if st.session_state.get("steer.curve_for") == curve_key:
        with st.spinner(f"Generating the {len(GRID)} λ positions as one batch, then their fluency…"):
            texts = steered_texts(spec, run, fp, ts, top_k, precision, document, tuple(GRID), max_new, how)
            fluencies = [text_fluency(spec, texts[g]) for g in GRID]
        curve = document_curve(document, texts, fluencies, scorer())
        fig = go.Figure()
        fig.add_trace(
            go.Scatter(
                x=curve["lambda"],
                y=curve["factuality"],
                mode="lines+markers",
                name="factuality",
                customdata=curve["text"].str.slice(0, 120),
                hovertemplate="λ=%{x:.2f}<br>factuality %{y:.3f}<br>%{customdata}<extra></extra>",
            )
        )
        broken = curve[curve["degenerate"]]
        fig.add_trace(
            go.Scatter(
                x=broken["lambda"],
                y=[0.0] * len(broken),
                mode="markers",
                name="degenerate (not scored)",
                marker=dict(symbol="x", size=11, color="#dc2626"),
                customdata=broken["reason"],
                hovertemplate="λ=%{x:.2f}<br>%{customdata}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=curve["lambda"],
                y=curve["perplexity"],
                mode="lines",
                name="perplexity (right axis)",
                yaxis="y2",
                line=dict(dash="dot", color="#6b7280"),
            )
        )
        fig.add_vline(x=lam, line_dash="dot", line_color="#dc2626")
        fig.update_layout(
            xaxis_title=f"λ ({spec_mode.label})",
            yaxis=dict(title="factuality (offline scorer)", range=[-0.05, 1.02]),
            yaxis2=dict(title="perplexity", overlaying="y", side="right", type="log", showgrid=False),
            height=320,
            legend=dict(orientation="h", y=-0.25),
        )
        plot(fig, key="steer.curve")
        csv_download(curve, "lambda_curve.csv", key="steer.curve_csv")
    else:
        st.caption(
            "One summary per slider position of this mode (cached, so the slider is instant afterwards), scored by "
            "the offline factuality scorer and for fluency; degenerate texts are marked, not scored."
        )
