"""Token overlay: tokens colored by the head's p(good) — a TOPL run's own head, or, for an adapter without one, a
linear probe head fitted on its hidden states (with the same probe on the base model as the control) — gold labels
beside them when known, a threshold control, per-token values on hover, and the base model's surprisal and the
model-free controls (the lexical control: the token's word absent from the document) as baselines."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import streamlit as st

from pages._ui.datasets import dataset_picker, records_of
from pages._ui.figures import token_bars
from pages._ui.models import merged_model, probe_heads, resource_lock, step_error, token_scorer
from pages._ui.render import csv_download, plot
from pages._ui.runs import run_fingerprint, run_picker
from pages._ui.spec import current_decode_precision, current_precision, current_spec
from topl_core.analysis.lexical import LEXICAL, control_scores
from topl_core.analysis.token_colors import legend_html, token_html
from topl_core.data.records import Record
from topl_core.foundations.metrics import auroc
from topl_core.inference.generate import GenerationConfig, generate
from topl_core.inference.token_scores import TokenScores
from topl_core.training.adapters import open_adapter

st.title("Token overlay")
st.caption(
    "Which tokens does the head think are unfaithful to the document? Red = low p(good). Hover a token for "
    "its values; a black underline marks gold-bad tokens."
)

spec, precision = current_spec(), current_precision()
top = st.columns([2, 1])
run = run_picker("Adapter", key="overlay.run", default_method="topl", container=top[0])
if run is None:
    st.stop()
fp = run_fingerprint(run)
adapter = open_adapter(run)
use_probe = not adapter.has_head
if use_probe:
    fitted = st.session_state.setdefault("overlay.probe_fitted", [])
    if fp not in fitted:
        st.info(
            f"**{adapter.name}** has no head ({adapter.method or 'method unknown'}: only TOPL, SOPL and TLDR train "
            "one). Fit a linear probe head on its frozen hidden states — FinalNorm after its last LoRA layer, "
            "logistic regression on the labelled tokens of 48 training records — and the same probe on the base model "
            "as the control: about two minutes for SmolLM2 on a 2-core CPU. Stored in the cache, never in the "
            "adapter's folder."
        )
        if not st.button("Fit a probe head", key="overlay.fit_probe", icon=":material/model_training:"):
            st.stop()
        fitted.append(fp)
        st.rerun()  # without the offer, straight to fitting
    try:
        probe, control = probe_heads(spec, run, fp, precision)
    except Exception as e:
        step_error(f"fit the probe head ({precision})", e)
        st.stop()
    st.caption(
        f"Probe head at layer {probe.layer}: validation token AUROC **{probe.val_auroc:.3f}** "
        f"({probe.n_val_tokens} tokens); the same probe on the base model (control): {control.val_auroc:.3f}."
    )
threshold = top[1].slider(
    "Flag tokens with p(good) below", 0.0, 1.0, 0.5, 0.01, key="overlay.threshold", persist_state="session"
)


@st.cache_data(show_spinner="Scoring tokens…", max_entries=64)
def score(spec: str, run: str, fp: str, precision: str, record: Record, probe_head: bool) -> TokenScores:
    return token_scorer(spec, run, fp, precision, probe_head).score([record])[0]


@st.cache_data(show_spinner="Generating a summary with the merged model…", max_entries=32)
def generate_summary(
    spec: str, run: str, fp: str, precision: str, decode: str, document: str, max_new_tokens: int
) -> str:
    lm = merged_model(spec, run, fp)
    with resource_lock(f"merged:{spec}:{run}:{fp}"):
        return generate(
            lm,
            [document],
            GenerationConfig(max_new_tokens=max_new_tokens, precision=precision, decode_precision=decode),
        )[0]


source = st.radio(
    "Text",
    ["From a data set", "Paste", "Generate with the merged model"],
    horizontal=True,
    key="overlay.source",
    persist_state="session",
)
record = None
if source == "From a data set":
    c1, c2, c3 = st.columns([2, 1, 1])
    path = dataset_picker("overlay.dataset", container=c1)
    if path:
        only_bad = c3.toggle("Only records with bad spans", True, key="overlay.only_bad", persist_state="session")
        pool = [r for r in records_of(path) if r.token_labels_known and (r.bad_spans or not only_bad)]
        if pool:
            i = c2.number_input(
                f"Record (of {len(pool)})", 0, len(pool) - 1, 0, key="overlay.index", persist_state="session"
            )
            record = pool[int(i)]
            with st.expander("Document"):
                st.write(record.document)
        else:
            st.warning("No token-labelled record here.")
else:
    doc = st.text_area(
        "Document",
        height=160,
        key="overlay.document",
        persist_state="session",
        value="The council of Leeds approved the new budget on Monday after a long debate. Police "
        "arrested two men in London and released a third. The company said profits increased "
        "by 12 percent in 2023.",
    )
    if source == "Paste":
        resp = st.text_area(
            "Summary / response",
            height=80,
            key="overlay.response",
            persist_state="session",
            value="The Leeds council rejected the budget on Friday. Profits increased by 40 percent.",
        )
    else:
        n_new = st.slider("Max new tokens", 16, 256, 64, key="overlay.max_new", persist_state="session")
        try:
            resp = generate_summary(spec, run, fp, precision, current_decode_precision(), doc, n_new)
        except Exception as e:
            step_error(f"generate a summary ({precision})", e)
            st.stop()
        st.caption(f"Generated by the merged adapter (greedy, {n_new} new tokens at most); scored below.")
    if doc.strip() and resp.strip():
        record = Record(id="input", document=doc, response=resp, token_labels_known=False)

if record is None:
    st.stop()
try:
    s = score(spec, run, fp, precision, record, use_probe)
except Exception as e:
    step_error(f"score the tokens ({precision})", e)
    st.stop()

flags = s.flags(threshold)
controls = control_scores(record.document, s.response, s.offsets)  # the model-free controls (analysis/lexical.py)
has_gold = flags.gold_bad is not None
m = st.columns(5)
m[0].metric("Tokens", flags.tokens)
m[1].metric("Flagged", flags.flagged)
m[2].metric("Mean p(good)", f"{flags.mean_p_good:.3f}")
if has_gold:
    m[3].metric("Gold bad tokens", flags.gold_bad)
    m[4].metric("Precision / recall", f"{flags.precision:.2f} / {flags.recall:.2f}")

st.markdown(
    token_html(
        s.tokens,
        p_good=s.p_good,
        gold=s.gold if has_gold else None,
        threshold=threshold,
        extra={"surprisal": s.surprisal, LEXICAL: controls[LEXICAL]},
    ),
    unsafe_allow_html=True,
)
st.markdown(legend_html(), unsafe_allow_html=True)
if has_gold:
    st.markdown("**Gold labels**")
    st.markdown(token_html(s.tokens, gold=s.gold), unsafe_allow_html=True)
    known = s.gold >= 0
    against = " · ".join(f"{name} {auroc(s.gold[known] == 0, v[known]):.3f}" for name, v in controls.items())
    st.caption(
        f"On this example, flagging bad tokens: head AUROC {flags.head_auroc:.3f} · base-model surprisal AUROC "
        f"{flags.surprisal_auroc:.3f} · without a model: {against} (one example, so no interval: "
        "`python -m topl_core transfer` gives them with record-bootstrap intervals)."
    )

table = s.table(threshold).assign(**{LEXICAL: controls[LEXICAL]})
plot(token_bars(table, threshold), key="overlay.bar")
csv_download(table, "token_scores.csv", key="overlay.csv")
