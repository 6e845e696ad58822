"""LoRA-A separability: per-layer × per-module AUROC of good vs bad tokens from each site's r-dim projection A·x,
two adapters side by side with their difference, mean ± std (with bootstrap CI and the random-init-A control),
and a UMAP of one site's projections."""

from pages._ui.frame import core_imports, ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py


import pandas as pd
import plotly.express as px
import streamlit as st

from pages._ui.render import csv_download, plot
from pages._ui.runs import finished_runs, run_fingerprint, run_picker
from pages._ui.spec import current_precision

st.title("LoRA-A separability")
st.caption(
    "Rows of LoRA-A are concept directions. For every (layer, module) site, the module's input is projected "
    "onto A's r rows; the AUROC says how well that r-dim projection separates faithful from hallucinated tokens."
)

with core_imports():  # the token sets are read with the analysis core too
    from pages._ui.token_sets import lora_a_probe, token_set, token_set_picker
    from topl_core.analysis.figures import auroc_heatmap
    from topl_core.analysis.lora_a.probe import ProbeSettings, run_projections
    from topl_core.analysis.lora_a.separability import METHOD, comparison_table
    from topl_core.analysis.lora_a.umap_view import umap_embedding  # loads umap (and numba) only when called

NONE = "(none)"
top = st.columns(2)
run_a = run_picker("Adapter", key="lora_a.run_a", default_method="topl", container=top[0])
if run_a is None:
    st.stop()
others = [p for p in finished_runs()["path"].tolist() if p != run_a]
df_runs = finished_runs().set_index("path")
if "lora_a.run_b" not in st.session_state or st.session_state["lora_a.run_b"] not in [NONE, *others]:
    sft = [p for p in others if df_runs.loc[p, "method"] == "sft"]
    st.session_state["lora_a.run_b"] = (sft or [NONE])[0]
run_b = top[1].selectbox(
    "Compare with",
    [NONE, *others],
    key="lora_a.run_b",
    persist_state="session",
    format_func=lambda p: p if p == NONE else f"{df_runs.loc[p, 'run']} · {df_runs.loc[p, 'method']}",
)
run_b = None if run_b == NONE else run_b

with st.form("lora_a.form", border=True):
    ts = token_set_picker("lora_a", run_a)
    c1, c2, c3 = st.columns(3)
    column = c1.radio(
        "Score per site",
        ["cv_auroc", "component_auroc"],
        horizontal=True,
        key="lora_a.column",
        persist_state="session",
        format_func=lambda c: {"cv_auroc": "CV logistic regression", "component_auroc": "best single component"}[c],
    )
    control = c2.toggle(
        "Random-init A control",
        True,
        key="lora_a.control",
        persist_state="session",
        help="The same r, A drawn like PEFT's init, on the same inputs: what 'chance' looks like here.",
    )
    folds = c3.number_input("CV folds", 2, 10, 5, key="lora_a.folds", persist_state="session")
    st.form_submit_button("Compute", type="primary", icon=":material/calculate:")
precision = current_precision()
st.caption(f"Method: {METHOD} Computed in {precision} (the sidebar's compute precision).")


results = {}
try:
    for r in [run_a, run_b]:
        if r:
            # the same tokens for both
            results[r] = lora_a_probe(r, run_fingerprint(r), ts, precision, int(folds), bool(control))
except Exception as e:
    st.error(f"Could not compute separability: {e}")
    st.stop()

res_a = results[run_a]
name_of = {p: f"{df_runs.loc[p, 'method']} · {df_runs.loc[p, 'run']}" for p in results}
sep_a = res_a.lora
m = st.columns(5)
m[0].metric(
    "Mean AUROC over sites",
    f"{sep_a.mean:.3f}",
    delta=f"± {sep_a.std:.3f} std",
    delta_color="off",
    delta_arrow="off",
    help="Mean (and population std) of the per-site AUROC across all LoRA sites.",
)
m[1].metric("95% CI of the mean", f"{sep_a.ci_low:.2f}–{sep_a.ci_high:.2f}", help="Percentile bootstrap over sites.")
if res_a.control is not None:
    m[2].metric(
        "Random-init A control",
        f"{res_a.control.mean:.3f}",
        delta=f"{sep_a.mean - res_a.control.mean:+.3f} vs adapter",
        delta_color="off",
        delta_arrow="off",
        help="The same r, A drawn like PEFT's init, on the same inputs: what 'chance' looks like here.",
    )
m[3].metric(
    "Tokens",
    f"{sep_a.n_good + sep_a.n_bad}",
    delta=f"{sep_a.n_good} good / {sep_a.n_bad} bad",
    delta_color="off",
    delta_arrow="off",
)
if run_b:
    sep_b = results[run_b].lora
    m[4].metric(
        f"{df_runs.loc[run_b, 'method'].upper()} mean",
        f"{sep_b.mean:.3f}",
        delta=f"± {sep_b.std:.3f} std · {sep_b.mean - sep_a.mean:+.3f}",
        delta_color="off",
        delta_arrow="off",
    )
st.caption(f"Token set: {res_a.token_set}")


n_layers = max(r.lora.num_layers or 0 for r in results.values()) or None
hm_a = sep_a.heatmap(column, n_layers)
cols = st.columns(3 if run_b else 1)
with cols[0]:
    plot(auroc_heatmap(hm_a, f"{name_of[run_a]}"), key="lora_a.heat_a")
if run_b:
    hm_b = results[run_b].lora.heatmap(column, n_layers)
    with cols[1]:
        plot(auroc_heatmap(hm_b, f"{name_of[run_b]}"), key="lora_a.heat_b")
    with cols[2]:
        plot(
            auroc_heatmap(
                hm_a - hm_b,
                f"Difference ({df_runs.loc[run_a, 'method']} − {df_runs.loc[run_b, 'method']})",
                diverging=True,
            ),
            key="lora_a.heat_diff",
        )

# per-layer means, with the control
lines = []
for r, res in results.items():
    lines.append(res.lora.heatmap(column, n_layers).mean(axis=1).rename(name_of[r]))
    if res.control is not None and r == run_a:
        lines.append(res.control.heatmap(column, n_layers).mean(axis=1).rename("random-init A (control)"))
per_layer = pd.concat(lines, axis=1).reset_index().melt(id_vars="layer", var_name="adapter", value_name="mean AUROC")
fig = px.line(
    per_layer, x="layer", y="mean AUROC", color="adapter", markers=True, title="Mean AUROC over modules, per layer"
)
fig.add_hline(y=0.5, line_dash="dot", line_color="gray")
plot(fig, key="lora_a.per_layer")

tables = pd.concat([res.lora.table().assign(adapter=name_of[r]) for r, res in results.items()], ignore_index=True)
ctrl = res_a.control
comp = comparison_table({name_of[r]: res.lora for r, res in results.items()}, control=ctrl)
st.subheader("Comparison")
st.dataframe(
    comp.drop(columns=["ood_factuality"]),
    hide_index=True,
    key="lora_a.comparison",
    column_config={
        c: st.column_config.NumberColumn(format="%.3f")
        for c in ("mean", "std", "ci95_low", "ci95_high", "component_mean")
    },
)
d1, d2 = st.columns(2)
csv_download(tables, "lora_a_sites.csv", key="lora_a.csv_sites", label="Per-site AUROCs (CSV)", container=d1)
csv_download(comp, "lora_a_comparison.csv", key="lora_a.csv_comp", label="Comparison table (CSV)", container=d2)

# --- UMAP -----------------------------------------------------------------------------------------------------
st.subheader("UMAP of one site's projections")
ranked = sep_a.table().sort_values("cv_auroc", ascending=False)
keys = ranked["key"].tolist()
u1, u2, u3 = st.columns([2, 1, 1])
site = u1.selectbox(
    "Site (sorted by AUROC)",
    keys,
    key="lora_a.umap_site",
    persist_state="session",
    format_func=lambda k: f"{k}  (AUROC {sep_a.by_key()[k].cv_auroc:.3f})",
)
n_neighbors = u2.number_input("Neighbours", 2, 200, 15, key="lora_a.umap_nn", persist_state="session")
go_umap = u3.button("Compute UMAP", key="lora_a.umap_go", icon=":material/scatter_plot:")


@st.cache_data(show_spinner="Embedding with UMAP…", max_entries=16)
def umap_df(run: str, fp: str, ts: tuple, site: str, n_neighbors: int, precision: str) -> pd.DataFrame:
    _, records = token_set(*ts)
    proj = run_projections(run, records, ProbeSettings(random_control=False, precision=precision))["lora"]
    return umap_embedding(proj.labelled(), site, n_neighbors=n_neighbors)


if go_umap or st.session_state.get("lora_a.umap_shown") == (run_a, site, int(n_neighbors)):
    st.session_state["lora_a.umap_shown"] = (run_a, site, int(n_neighbors))
    try:
        emb = umap_df(run_a, run_fingerprint(run_a), ts, site, int(n_neighbors), precision)
        emb["label"] = emb["label"].map({1: "good", 0: "bad", -1: "unlabelled"})
        fig = px.scatter(
            emb,
            x="x",
            y="y",
            color="label",
            hover_data=["token", "record_id", "position"],
            color_discrete_map={"good": "#16a34a", "bad": "#dc2626", "unlabelled": "#9ca3af"},
            title=f"{site}: A·x of {len(emb)} tokens",
            opacity=0.75,
        )
        fig.update_traces(marker=dict(size=6))
        plot(fig, key="lora_a.umap")
        csv_download(emb, f"umap_{site}.csv", key="lora_a.umap_csv")
    except Exception as e:
        st.error(f"UMAP failed: {e}")
else:
    st.caption("UMAP takes a few seconds (the first time, numba compiles it): press **Compute UMAP**.")
