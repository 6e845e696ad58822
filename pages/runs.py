"""Runs: every run and adapter, and opening an adapter from elsewhere (a PEFT folder or a hub id); compare runs side
by side — config diff, training/validation curves, final metrics, the ID/OOD factuality and average sentence count
of their evaluations (when evaluated), and the paper's LoRA-A indicator table (AUROC beside factuality, Spearman ρ)."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import plotly.express as px
import streamlit as st

from pages._ui.evaluations import run_factuality
from pages._ui.render import csv_download, plot, rho_text
from pages._ui.runs import all_runs, open_by_reference, run_fingerprint
from pages._ui.spec import current_precision
from pages._ui.token_sets import default_token_set, lora_a_probe
from topl_core.analysis.evaluation.indicator import MIN_ADAPTERS_FOR_RHO, indicator_table
from topl_core.foundations.errors import WorkbenchError
from topl_core.foundations.paths import examples_dir, runs_dir
from topl_core.training.adapters import open_adapter
from topl_core.training.run_dirs import RunDir

st.title("Runs")
st.caption(
    f"Every run directory in `{runs_dir()}`, and the demo adapters shipped in `{examples_dir()}` (marked "
    "*example*). Pick runs to compare their configs, curves and results."
)

with st.expander("Open an adapter trained elsewhere", expanded=False):
    st.caption(
        "A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors, e.g. saved by TRL or peft) or a hub "
        "adapter id. Its base model comes from its adapter_config.json (SmolLM2-135M-Instruct opens on the embedded "
        "smollm2-135m). LoRA-A, Steering, Evaluation and generation work on it as on a run; the Token overlay "
        "fits a probe head on its hidden states, since it has no head. Folders under the runs folder are listed "
        "without opening."
    )
    c1, c2 = st.columns([5, 1], vertical_alignment="bottom")
    ref = c1.text_input("Folder or hub id", key="runs.open_ref", placeholder="/path/to/adapter  or  user/adapter")
    if c2.button("Open", key="runs.open", icon=":material/folder_open:") and ref.strip():
        try:
            opened = open_by_reference(ref)
            st.success(f"Opened **{opened.name}**: base model {opened.base_model}; {opened.lora.describe()}.")
        except WorkbenchError as e:
            st.error(str(e))

df = all_runs()
if df.empty:
    st.info("No runs yet: start one on the **Train** page, or open an adapter above.")
    st.stop()

st.dataframe(
    df.drop(columns=["path", "complete", "warnings"]),
    hide_index=True,
    key="runs.table",
    column_config={
        "val_token_auroc": st.column_config.NumberColumn("val token AUROC", format="%.3f"),
        "loss": st.column_config.NumberColumn(format="%.4f"),
        "lr": st.column_config.NumberColumn(format="%.1e"),
        "has_head": st.column_config.CheckboxColumn("head"),
    },
)

for run, warning in df.loc[df["warnings"] != "", ["run", "warnings"]].itertuples(index=False):
    st.warning(f"**{run}**: {warning}", icon=":material/warning:")  # e.g. a tracker that failed mid-run

names = df["run"].tolist()
default = df[df["complete"].astype(bool)]["run"].tolist()[:2] or names[:2]
chosen = st.multiselect("Compare", names, default=default, key="runs.compare", persist_state="session")
if not chosen:
    st.stop()
paths = {n: df.set_index("run").loc[n, "path"] for n in chosen}


# the Results table's factuality columns (from run_factuality) → the indicator table's
RESULT_COLUMNS = {"ID factuality": "id_factuality", "OOD factuality": "ood_factuality", "avg sentences": "sentences"}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v
    return out


configs, metas = {}, {}
for n, p in paths.items():
    adapter = open_adapter(p)
    if adapter.run is not None:
        cfg, meta = adapter.run.read_config()
        configs[n], metas[n] = flat(cfg.to_json()), meta
    else:  # an adapter from elsewhere: what its adapter_config.json says
        configs[n] = flat({"method": "unknown", "model": adapter.base_model, "lora": asdict(adapter.lora)})
        metas[n] = {}
cfg_df = pd.DataFrame(configs)
cfg_df.index.name = "field"
differs = cfg_df.astype(str).nunique(axis=1) > 1

tab_results, tab_curves, tab_cfg = st.tabs(["Results", "Curves", "Config diff"])
with tab_cfg:
    only_diff = st.toggle(
        "Only fields that differ", value=len(chosen) > 1, key="runs.only_diff", persist_state="session"
    )
    shown = cfg_df[differs] if only_diff else cfg_df
    if shown.empty:
        st.success("These runs have identical configs.")
    else:
        styled = shown.astype(str).style.apply(
            lambda row: ["background-color: rgba(250,204,21,.3)" if differs[row.name] else "" for _ in row], axis=1
        )
        st.dataframe(styled, key="runs.cfg_diff")
    csv_download(cfg_df.reset_index(), "run_configs.csv", key="runs.cfg_csv")

with tab_curves:
    frames = []
    for n, p in paths.items():
        m = pd.DataFrame(RunDir(p).read_metrics())
        if not m.empty:
            frames.append(m.assign(run=n))
    if not frames:
        st.info("No metrics logged yet.")
    else:
        allm = pd.concat(frames, ignore_index=True)
        c1, c2 = st.columns(2)
        with c1:
            plot(px.line(allm, x="step", y="loss", color="run", title="Training loss"), key="runs.loss")
        with c2:
            val_cols = [c for c in allm.columns if c.startswith("val_") and c not in ("val_tokens", "val_examples")]
            if val_cols:
                metric = st.selectbox("Validation metric", val_cols, key="runs.val_metric", persist_state="session")
                v = allm[["step", "run", metric]].dropna()
                plot(px.line(v, x="step", y=metric, color="run", markers=True, title=metric), key="runs.val")
            else:
                st.info("These runs logged no validation metrics.")
        csv_download(allm, "run_metrics.csv", key="runs.metrics_csv")

with tab_results:
    rows = []
    for n, p in paths.items():
        run = RunDir(p)
        m = run.read_metrics()
        last_val = next((r for r in reversed(m) if "val_token_auroc" in r or any(k.startswith("val_") for k in r)), {})
        # an adapter from elsewhere has no status of ours: it is simply there, complete
        status = run.read_status() if run.config_path.exists() else {"state": "finished"}
        row = {
            "run": n,
            "method": configs[n]["method"],
            "state": status.get("state"),
            "steps": status.get("step"),
            "final loss": m[-1]["loss"] if m else None,
            "val token AUROC": last_val.get("val_token_auroc"),
            "train time (s)": status.get("elapsed_s"),
            "train examples": metas[n].get("n_train_examples"),
            "head layer": metas[n].get("head_layer"),
        }
        row.update(run_factuality(Path(p).name))  # ID/OOD factuality + sentences from the newest evaluation of this run
        rows.append(row)
    res = pd.DataFrame(rows)
    st.dataframe(
        res,
        hide_index=True,
        key="runs.results",
        column_config={
            "final loss": st.column_config.NumberColumn(format="%.4f"),
            "val token AUROC": st.column_config.NumberColumn(format="%.3f"),
            "train time (s)": st.column_config.NumberColumn(format="%.0f"),
            **{
                c: st.column_config.NumberColumn(format="%.3f")
                for c in ("ID factuality", "OOD factuality", "avg factuality")
            },
            "avg sentences": st.column_config.NumberColumn(format="%.2f"),
        },
    )
    st.caption(
        "ID / OOD factuality and the average sentence count appear here once a run has been evaluated "
        "(Evaluation page)."
    )
    csv_download(res, "run_results.csv", key="runs.results_csv")

    st.subheader("LoRA-A as an indicator of OOD generalization")
    if st.toggle(
        "Add each run's LoRA-A AUROC, the random-A control and its rank correlation with factuality",
        key="runs.indicator",
        persist_state="session",
        help="The paper's table: LoRA-A separability on one token set (the first run's val split, as the LoRA-A "
        "page's default) beside the factuality above. Computed once per run, then read from the cache.",
    ):
        ts = default_token_set(paths[chosen[0]])
        try:
            probes = {n: lora_a_probe(p, run_fingerprint(p), ts, current_precision()) for n, p in paths.items()}
        except Exception as e:  # a run without LoRA on any probed site, an unreadable token set, ...
            st.error(f"Could not compute LoRA-A separability: {e}")
        else:
            factuality = res.set_index("run").reindex(columns=list(RESULT_COLUMNS)).rename(columns=RESULT_COLUMNS)
            table, rho = indicator_table(
                {n: pr.lora for n, pr in probes.items()}, factuality, probes[chosen[0]].control
            )
            st.dataframe(
                table.drop(columns=["mean", "std"]),
                hide_index=True,
                key="runs.indicator_table",
                column_config={
                    c: st.column_config.NumberColumn(format="%.3f")
                    for c in ("ci95_low", "ci95_high", "component_mean", "ood_factuality", "id_factuality")
                },
            )
            st.caption(
                f"Token set: {probes[chosen[0]].token_set}. Spearman ρ of LoRA-A mean AUROC with OOD factuality "
                f"{rho_text(rho['ood_factuality'])}, with ID factuality {rho_text(rho['id_factuality'])} — over the "
                "runs with an "
                f"evaluation; it needs {MIN_ADAPTERS_FOR_RHO} or more (— otherwise): compare the methods you "
                "trained, each evaluated on the Evaluation page."
            )
            csv_download(table, "lora_a_indicator.csv", key="runs.indicator_csv")
