"""Steering: a λ slider regenerates the summary with the merged model steered in one of the registered modes
(topl_core/runtime/modes.py: LoRA-B's vector v = scaling·B(μ+ − μ−) at the top-k residual-writing sites
(the paper), the adapter's own update scaled by λ, two controls with the vector's norm, the vector gated by the
adapter's own head while generating) — on every position or only on generated tokens. Base | merged | steered side by
side with the changed words highlighted (gated: the tokens the head took back struck through, with their replacements),
factuality and fluency under each (a degenerate text is marked as such); the sites used; the λ curve of
factuality and fluency; export of the vectors (safetensors + JSON, llama.cpp control vector and LoRA).

Built for live demos: the merged model and the steering vectors are cached per (model spec, run fingerprint, token
set, k) with st.cache_resource and shared read-only (steering hooks act only on the generating thread); every
generated text is cached per λ, so dragging back to a λ already seen is instant."""

from pages._ui.frame import core_imports, ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import html
from pathlib import Path

import streamlit as st

from pages._ui.figures import lambda_curve
from pages._ui.forms import mode_settings, opening_values
from pages._ui.models import step_error
from pages._ui.render import csv_download, plot, steered_html, steered_summary, text_box
from pages._ui.runs import run_fingerprint, run_picker
from pages._ui.spec import current_decode_precision, current_precision, current_spec

with core_imports():  # the token sets and the page's cached work are read with the analysis core too
    from pages._ui.steering import (
        SessionKey,
        base_texts,
        document_picker,
        export_zip,
        generation,
        opened_view,
        quality_caption,
        scorer,
        scorer_caption,
        text_fluency,
        written,
    )
    from pages._ui.token_sets import token_set, token_set_picker
    from topl_core.analysis.evaluation.lambda_study import document_curve
    from topl_core.analysis.lora_a.probe import STEERING_TOKEN_RECORDS
    from topl_core.analysis.steering.slider import neighbours
    from topl_core.analysis.steering.summary import site_table
    from topl_core.data.encode import truncate_document, user_message
    from topl_core.inference.generate import GenerationCancelled
    from topl_core.runtime.modes import MODES, SteerConfig
    from topl_core.runtime.steered_text import SteeredText
    from topl_core.serve.protocol import client_code

st.title("Steering")
st.caption(
    "Push the merged model toward faithful (λ > 0) or hallucinated (λ < 0) summaries by adding "
    "λ · scaling · B(μ+ − μ−) to the outputs of the adapter's most separating sites — or scale the adapter's own "
    "update, compare with two controls of the same norm, or let the adapter's head decide where the vector acts."
)
spec, precision, decode = current_spec(), current_precision(), current_decode_precision()
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
    disabled=not MODES[mode].steers_positions,  # the mode decides which positions it steers
    help="Leave the prompt (the document) untouched and steer only the tokens the model writes.",
)
opens = opening_values(run, fp, mode)  # the adapter's recommended τ and λ (`recommend`), where it has them
tau = {"tau": opens.tau} if opens.tau is not None else {}
settings = mode_settings(st, MODES[mode].settings, "steer.", tau)  # the mode's own: a gated mode's τ and k
how = SteerConfig(mode, "generated" if generated_only else "all", **settings)
with st.expander("Token set for μ+ / μ− and the site AUROCs", expanded=False):
    ts = token_set_picker("steer", run, default_limit=STEERING_TOKEN_RECORDS)


# --- the document -----------------------------------------------------------------------------------------
document = document_picker()
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
        index=spec_mode.range_choices.index(opens.bound(spec_mode.range_choices, default_bound)),
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
    opens.position(GRID, neutral),  # the recommended λ, else the neutral one
    step=STEP,
    key=f"steer.lambda.{spec_mode.family}",
    persist_state="session",
    help=spec_mode.lambda_help
    + " Every position is cached once generated: press 'Generate every λ' below before a talk and "
    "dragging is instant.",
)
unit_slot = st.empty()  # what one unit of λ is, once the steering vectors are computed
st.caption(f"Opens at {opens.source}.")
curve_key = (run, fp, document[:200], top_k, max_new, bound, how)  # the λ grid asked for ("Generate every λ")
session_key, gen = SessionKey(spec, run, fp, ts, top_k, precision), generation(precision, decode, max_new)
lam = round(float(lam), 6)
titles = ["Base model", f"Merged adapter (λ = {neutral:g})", f"Steered ({spec_mode.label}, λ = {lam:+.2f})"]
slots = [col.empty() for col in st.columns(3, gap="medium")]


def draw(i: int, g: SteeredText, caption: str) -> None:
    """Box i's finished text (the steered box marked against the merged text, once that is written) with its caption."""
    merged = texts.get(1)
    body = steered_html(merged.text, g) if i == 2 and merged else html.escape(g.text).replace("\n", "<br>")
    slots[i].markdown(text_box(titles[i], body or "<i>(empty)</i>", caption), unsafe_allow_html=True)


def box(i: int, done, parts, ahead=lambda: False, also: tuple[int, ...] = ()) -> None:
    """Box i (and the boxes `also`, showing the same text as it comes): drawn at once when written before, else
    filled in token by token; scored once all three are shown."""
    try:
        g = written([(slots[j], titles[j]) for j in (i, *also)], done, parts, ahead)
    except GenerationCancelled:  # this reader asked for another λ meanwhile
        st.stop()
    except Exception as e:
        step_error(f"generate the summaries ({precision})", e)
        st.stop()
    texts.update(dict.fromkeys((i, *also), g))
    for j in (i, *also):
        draw(j, g, "scoring…")


# The text a person waits for first: the steered one, then the merged one it is marked against, then the base model's
texts: dict[int, SteeredText] = {}
view = opened_view(session_key, gen, document, how)  # asks for the compiled decode step at once
vec = view.session.vectors
unit_note = spec_mode.action.unit_note(vec, spec_mode, how.units, lam)
if unit_note:
    unit_slot.caption(unit_note)
if lam != neutral:
    box(2, view.text(lam), lambda: view.stream(lam), lambda: view.writing(lam))
box(1, view.text(neutral), view.merged, also=(2,) if lam == neutral else ())  # at the neutral λ: one text
if lam != neutral:
    draw(2, texts[2], "scoring…")  # now marked against the merged text
box(0, *base_texts(spec, gen, document))
view.ahead(neighbours(GRID, lam))  # the slider's next move reads them, written while these texts are read
t_base, t_merged, t_steered = texts[0], texts[1], texts[2]
st.markdown(steered_summary(t_merged.text, t_steered, lam), unsafe_allow_html=True)
for i, g in sorted(texts.items()):  # scored after every text is shown (cached per text: a rerun scores nothing again)
    draw(i, g, quality_caption(spec, document, g))
decoding = " New tokens: the compiled decode step (built in the background for this document's length)."
st.caption(
    f"Factuality: {scorer_caption()}. Fluency: perplexity under the base model, distinct-2; a text is marked "
    "degenerate when it repeats itself, turns into non-words or is empty (thresholds: "
    f"topl_core/analysis/steering/fluency.py).{decoding if view.decode_ready() else ''}"
)

with st.expander("This steering from your own code (the OpenAI-compatible service)"):
    prompt = user_message(truncate_document(view.session.lm.tokenizer, document, gen.max_doc_tokens))
    request = client_code(Path(run).name, how, lam, prompt)
    st.code(request["python"], language="python")
    st.code(request["curl"], language="bash")
    st.caption("`python -m topl_core serve --run RUN` serves it (docs/serve.md), each token with its p(good).")

# --- sites and vectors ------------------------------------------------------------------------------------
left, right = st.columns([1, 1], gap="large")
with left:
    st.subheader("Steered sites")
    sites = site_table(vec)
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
    bundle = export_zip(session_key)
    st.download_button(
        "Export steering vectors (safetensors + JSON, llama.cpp control vectors)",
        bundle.data,
        file_name=f"steering-{Path(run).name}.zip",
        mime="application/zip",
        key="steer.export",
        icon=":material/download:",
        help="vector.gguf / diff-mean.gguf hold λ = 1 in normalised units and lora.gguf the adapter's LoRA (the "
        "vectors belong to base + LoRA): `llama-completion -m MODEL-F32.gguf --lora lora.gguf "
        "--control-vector-scaled vector.gguf:2` steers like λ = 2 here on every position (an o_proj vector is added "
        "at the end of its layer: an approximation; docs/analysis.md, Export). steering_vectors.safetensors + "
        "steering.json hold the raw vectors of the paper's formula and the per-site factors."
        + (
            f" Left out of the .gguf files: {', '.join(bundle.left_out)} (llama.cpp has no direction for layer 0)."
            if bundle.left_out
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
            grid_texts = {g: text.text for g, text in view.every(GRID).items()}  # the slider reads them from now on
            fluencies = [text_fluency(spec, grid_texts[g]) for g in GRID]
        curve = document_curve(document, grid_texts, fluencies, scorer())
        plot(lambda_curve(curve, lam, f"λ ({spec_mode.label})"), key="steer.curve")
        csv_download(curve, "lambda_curve.csv", key="steer.curve_csv")
    else:
        st.caption(
            "One summary per slider position of this mode (cached, so the slider is instant afterwards), scored by "
            "the offline factuality scorer and for fluency; degenerate texts are marked, not scored."
        )
