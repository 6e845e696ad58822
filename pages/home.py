"""Home: what the workbench does, the current model, the adapters found, and where to start."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import streamlit as st

from pages._ui.models import base_model, load_error
from pages._ui.runs import all_runs
from pages._ui.spec import current_spec, split_spec
from topl_core.foundations.cache_usage import summary_line
from topl_core.foundations.paths import runs_dir

st.title("TOPL Workbench")
st.markdown(
    "**Token-Level Off-Policy Labeling**: train LoRA adapters for faithful generation from per-token good/bad "
    "labels, then open them up.  \n"
    "Build token-labelled data → train TOPL or a baseline (SFT, DPO, SOPL, TLDR, unlikelihood, TDPO) → read the "
    "LoRA-A concept directions as classifiers, steer with LoRA-B, and see the head's token predictions.  \n"
    "Everything runs on CPU with a small embedded model; pick a hub model and `cuda` in the sidebar for 4B–8B models."
)

spec = current_spec()
name, dtype, device = split_spec(spec)
left, right = st.columns([1, 2], gap="large")
with left:
    st.subheader("Model")
    try:
        lm = base_model(spec)
        cfg = lm.model.config
        c1, c2 = st.columns(2)
        c1.metric("Layers", lm.num_layers)
        c2.metric("Hidden size", cfg.hidden_size)
        c1.metric("Parameters", f"{sum(p.numel() for p in lm.model.parameters()) / 1e6:.1f} M")
        c2.metric("Family", cfg.model_type)
        st.caption(f"`{name}` · {dtype} · {device} · fingerprint `{lm.fingerprint}`")
    except Exception as e:  # ModelError and friends: show the actionable message, keep the page usable
        load_error(e)

with right:
    st.subheader("Adapters found")
    df = all_runs()
    if df.empty:
        st.info(f"No runs in `{runs_dir()}` yet: train one on the **Train** page.")
    else:
        st.dataframe(
            df[["run", "method", "model", "state", "step", "steps", "val_token_auroc", "layers"]],
            hide_index=True,
            key="home.runs",
            column_config={
                "val_token_auroc": st.column_config.NumberColumn("val token AUROC", format="%.3f"),
                "state": st.column_config.TextColumn("state"),
            },
        )
        n_ex = int((df["source"] == "example").sum())
        st.caption(
            f"{len(df) - n_ex} runs in `{runs_dir()}` and {n_ex} shipped demo adapters (*example*) · "
            f"{int((df['model'] == name).sum())} for the current model"
        )

st.subheader("Where to start")
cols = st.columns(4)
starts = [
    (
        "pages/data.py",
        "Data",
        ":material/dataset:",
        "Browse token labels, label-sensitivity settings, build or import data.",
    ),
    (
        "pages/train.py",
        "Train",
        ":material/model_training:",
        "Launch TOPL or a baseline in the background and watch it.",
    ),
    (
        "pages/steering.py",
        "Steering",
        ":material/tune:",
        "Drag λ and watch the summary move toward faithful or hallucinated.",
    ),
    (
        "pages/token_overlay.py",
        "Token overlay",
        ":material/format_color_text:",
        "See which tokens the TOPL head flags.",
    ),
]
for col, (path, label, icon, text) in zip(cols, starts):
    with col.container(border=True):
        st.page_link(path, label=label, icon=icon)
        st.caption(text)

st.caption(f"Caches: {summary_line()} · `python -m topl_core cache` shows what each holds and clears it by kind or age")
