"""Token overlay: tokens colored by the TOPL head's p(good), gold labels beside them when known, a threshold
control, per-token values on hover, and the base model's surprisal as a baseline detector."""

from pages._ui import ensure_frame

ensure_frame()  # first: see pages/_ui.py

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages._ui import (csv_download, current_spec, dataset_picker, legend_html, load_error, merged_model, plot,
                       records_of, resource_lock, run_fingerprint, run_picker, token_html, token_scorer)
from topl_core.data.records import Record
from topl_core.metrics import auroc

st.title("Token overlay")
st.caption("Which tokens does the head think are unfaithful to the document? Red = low p(good). Hover a token for "
           "its values; a black underline marks gold-bad tokens.")

spec = current_spec()
top = st.columns([2, 1])
run = run_picker("Adapter with a head (TOPL / SOPL / TLDR)", key="overlay.run", need_head=True, default_method="topl",
                 container=top[0])
if run is None:
    st.stop()
fp = run_fingerprint(run)
threshold = top[1].slider("Flag tokens with p(good) below", 0.0, 1.0, 0.5, 0.01, key="overlay.threshold")


@st.cache_data(show_spinner="Scoring tokens…", max_entries=64)
def score(spec: str, run: str, fp: str, record: Record) -> dict:
    s = token_scorer(spec, run, fp).score([record])[0]
    return {"tokens": s.tokens, "p_good": s.p_good.astype(float), "surprisal": s.surprisal.astype(float),
            "gold": s.gold.astype(int)}


@st.cache_data(show_spinner="Generating a summary with the merged model…", max_entries=32)
def generate_summary(spec: str, run: str, fp: str, document: str, max_new_tokens: int) -> str:
    from topl_core.generate import GenerationConfig, generate

    lm = merged_model(spec, run, fp)
    with resource_lock(f"merged:{spec}:{run}:{fp}"):
        return generate(lm, [document], GenerationConfig(max_new_tokens=max_new_tokens))[0]


source = st.radio("Text", ["From a data set", "Paste", "Generate with the merged model"], horizontal=True,
                  key="overlay.source")
record = None
if source == "From a data set":
    c1, c2, c3 = st.columns([2, 1, 1])
    path = dataset_picker("overlay.dataset", container=c1)
    if path:
        only_bad = c3.toggle("Only records with bad spans", True, key="overlay.only_bad")
        pool = [r for r in records_of(path) if r.token_labels_known and (r.bad_spans or not only_bad)]
        if pool:
            i = c2.number_input(f"Record (of {len(pool)})", 0, len(pool) - 1, 0, key="overlay.index")
            record = pool[int(i)]
            with st.expander("Document"):
                st.write(record.document)
        else:
            st.warning("No token-labelled record here.")
else:
    doc = st.text_area("Document", height=160, key="overlay.document",
                       value="The council of Leeds approved the new budget on Monday after a long debate. Police "
                             "arrested two men in London and released a third. The company said profits increased "
                             "by 12 percent in 2023.")
    if source == "Paste":
        resp = st.text_area("Summary / response", height=80, key="overlay.response",
                            value="The Leeds council rejected the budget on Friday. Profits increased by 40 percent.")
    else:
        n_new = st.slider("Max new tokens", 16, 256, 64, key="overlay.max_new")
        try:
            resp = generate_summary(spec, run, fp, doc, n_new)
        except Exception as e:
            load_error(e)
            st.stop()
        st.markdown(f"**Generated:** {resp}")
    if doc.strip() and resp.strip():
        record = Record(id="input", document=doc, response=resp, token_labels_known=False)

if record is None:
    st.stop()
try:
    s = score(spec, run, fp, record)
except Exception as e:
    load_error(e)
    st.stop()

p, gold, sur = s["p_good"], s["gold"], s["surprisal"]
has_gold = bool((gold >= 0).any())
flag = p < threshold
m = st.columns(5)
m[0].metric("Tokens", len(p))
m[1].metric("Flagged", int(flag.sum()))
m[2].metric("Mean p(good)", f"{p.mean():.3f}")
if has_gold:
    keep = gold >= 0
    bad = (gold[keep] == 0).astype(int)
    tp = int((flag[keep] & (bad == 1)).sum())
    m[3].metric("Gold bad tokens", int(bad.sum()))
    prec = tp / max(1, int(flag[keep].sum()))
    rec = tp / max(1, int(bad.sum()))
    m[4].metric("Precision / recall", f"{prec:.2f} / {rec:.2f}")

st.markdown(token_html(s["tokens"], p_good=p, gold=gold if has_gold else None, threshold=threshold,
                       extra={"surprisal": sur}), unsafe_allow_html=True)
st.markdown(legend_html(), unsafe_allow_html=True)
if has_gold:
    st.markdown("**Gold labels**")
    st.markdown(token_html(s["tokens"], gold=gold), unsafe_allow_html=True)
    ha, sa = auroc(bad, 1 - p[keep]), auroc(bad, sur[keep])
    st.caption(f"On this example, flagging bad tokens: head AUROC {ha:.3f} · base-model surprisal AUROC {sa:.3f}.")

table = pd.DataFrame({"position": np.arange(len(p)), "token": s["tokens"], "p_good": p, "surprisal": sur,
                      "gold": np.where(gold == 1, "good", np.where(gold == 0, "bad", "")), "flagged": flag})
colors = np.where(gold == 0, "#111827", np.where(flag, "#dc2626", "#16a34a"))
fig = go.Figure(go.Bar(x=table["position"], y=p, marker_color=colors,
                       customdata=np.stack([table["token"], table["gold"], sur], axis=1),
                       hovertemplate="%{customdata[0]}<br>p(good)=%{y:.3f}<br>gold=%{customdata[1]}"
                                     "<br>surprisal=%{customdata[2]:.2f}<extra></extra>"))
fig.add_hline(y=threshold, line_dash="dash", line_color="#dc2626", annotation_text="threshold")
fig.update_layout(title="p(good) per token (black = gold bad)", xaxis_title="token", yaxis_title="p(good)",
                  yaxis_range=[0, 1], height=280)
plot(fig, key="overlay.bar")
csv_download(table, "token_scores.csv", key="overlay.csv")
