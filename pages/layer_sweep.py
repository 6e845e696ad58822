"""Layer sweep: TOPL trained with LoRA on a sliding window of layers [s, s+k) (head after the window), for a grid
of (start, size), in a background process. The (start × size) heatmap and the k-lines fill in as windows finish;
the sweep is resumable (finished windows are kept)."""

from pages._ui.frame import ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import time
from pathlib import Path

import numpy as np
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from pages._ui.datasets import dataset_paths
from pages._ui.forms import precision_select
from pages._ui.models import layer_count_or_stop
from pages._ui.render import csv_download, plot
from pages._ui.spec import current_spec, split_spec
from topl_core import jobs
from topl_core.paths import runs_dir
from topl_core.errors import ConfigError
from topl_core.training.config import TrainConfig

try:
    from topl_core.analysis.sweeps import SweepConfig, heatmap_table, lines_table, plan_windows, read_sweep
except ImportError as e:
    st.error(f"The analysis core is not available: {e}")
    st.stop()

st.title("Layer sweep")
st.caption("Which layers should carry the LoRA? TOPL is trained on windows of k consecutive layers starting at s, "
           "and each window is scored by its head's token AUROC on the validation split.")

spec = current_spec()
model_name, _, device = split_spec(spec)
n_layers = layer_count_or_stop(spec)
SWEEPS = runs_dir() / "sweeps"
K = "sweep."

with st.expander("Start a sweep", expanded=not SWEEPS.is_dir() or not any(SWEEPS.iterdir())):
    with st.form("sweep.form", border=False):
        a, b, c, d = st.columns(4)
        name = a.text_input("Sweep name", f"sweep-{Path(model_name).name}-{time.strftime('%m%d-%H%M')}", key=K + "name",
                            persist_state="session")
        data = b.selectbox("Data set", dataset_paths(), key=K + "data",
                           persist_state="session", format_func=lambda p: Path(p).name)
        default_sizes = [k for k in (3, 6, 12) if k <= n_layers] or [max(1, n_layers // 2)]
        sizes = c.multiselect("Window sizes k", list(range(1, n_layers + 1)), default=default_sizes, key=K + "sizes",
                              persist_state="session")
        stride = d.number_input("Start every … layers", 1, n_layers, min(3, n_layers), key=K + "stride",
                                persist_state="session")
        a, b, c, d = st.columns(4)
        steps = a.number_input("Steps per window", 1, 100_000, 20, key=K + "steps", persist_state="session")
        lr = b.number_input("Learning rate", 1e-7, 1.0, 1e-4, format="%.1e", key=K + "lr", persist_state="session")
        batch = c.number_input("Batch size", 1, 1024, 8, key=K + "batch", persist_state="session")
        precision = precision_select(d, K + "precision", device)
        a, b, c, _ = st.columns(4)
        reuse = a.toggle("Reuse frozen prefix", True, key=K + "reuse", persist_state="session",
                         help="Layers below a window carry no LoRA: their activations are computed once and reused.")
        n_gen = b.number_input("Also score generations on … test docs", 0, 1000, 0, key=K + "n_gen",
                               persist_state="session")
        max_doc = c.number_input("Max document tokens", 16, 32_768, 320, key=K + "max_doc", persist_state="session")
        go_sweep = st.form_submit_button("Start sweep", type="primary", icon=":material/play_arrow:")
    try:
        n_windows = len(plan_windows(n_layers, tuple(sizes), int(stride))) if sizes else 0
        st.caption(f"{n_windows} windows on {n_layers} layers.")
    except ConfigError as e:
        st.caption(str(e))
    if go_sweep:
        try:
            if not data:
                raise ConfigError("data: build a data set on the Data page first.")
            train = TrainConfig(model=model_name, data=str(Path(data).resolve()), steps=int(steps), lr=float(lr),
                                batch_size=int(batch), precision=precision, device=device, eval_every=int(steps),
                                checkpoint_every=max(1, min(10, int(steps))), max_val_examples=32,
                                max_doc_tokens=int(max_doc))
            cfg = SweepConfig(train=train, sizes=tuple(sorted(sizes)), stride=int(stride), reuse_prefix=reuse,
                              n_generate=int(n_gen))
            path = jobs.launch_sweep(cfg, SWEEPS / name.strip().replace("/", "_"))
            st.session_state[K + "show"] = str(path.relative_to(runs_dir().resolve()))
            st.rerun()
        except (ConfigError, jobs.JobError, ValueError) as e:
            st.error(str(e))

# sweeps started here live in runs/sweeps/; the CLI's (python -m topl_core sweep --out runs/NAME) anywhere in runs/
found = [p for d in (SWEEPS, runs_dir()) if d.is_dir() for p in d.iterdir() if (p / "sweep.json").exists()]
sweeps = sorted(set(found), key=lambda p: -p.stat().st_mtime)
if not sweeps:
    st.info("No sweep yet: start one above. On a CPU a tiny grid (e.g. k = 3, stride 6, 10 steps) takes minutes "
            "with SmolLM2; the page fills in as windows finish.")
    st.stop()
names = [str(p.relative_to(runs_dir())) for p in sweeps]
if st.session_state.get(K + "show") not in names:
    st.session_state[K + "show"] = names[0]
sel = st.selectbox("Sweep", names, key=K + "show", persist_state="session")
sweep_dir = runs_dir() / sel
VALUE_LABEL = {"val_token_auroc": "head token AUROC (val)", "gen_factuality": "generation factuality",
               "train_s": "training time (s)"}


def panel() -> None:
    job = jobs.read_job(sweep_dir)
    state = job.state if job else "unknown"
    active = job is not None and job.active
    if st.session_state.get(K + "was_running") and not active:
        st.session_state[K + "was_running"] = False
        st.rerun(scope="app")  # the sweep ended: stop polling
    st.session_state[K + "was_running"] = active
    done, total = (job.step, job.steps) if job else (0, 0)
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    cur = f" · training {job.current}" if job and job.current else ""
    c1.progress(done / total if total else 0.0, text=f"{state} · {done}/{total} windows{cur}")
    if active:
        if c2.button("Stop", key=K + "stop", icon=":material/stop:",
                     help="Stops after the current step; the window keeps a checkpoint and the sweep can resume."):
            jobs.cancel(sweep_dir)
            st.toast("Stopping after the current step…")
    elif state in ("cancelled", "failed", "interrupted") and c2.button("Resume", key=K + "resume",
                                                                        icon=":material/replay:"):
        try:
            jobs.resume_sweep_job(sweep_dir)
            st.rerun(scope="app")
        except jobs.JobError as e:
            st.error(str(e))
    if job and job.error and state != "finished":
        st.caption(job.error[:300])

    df = read_sweep(sweep_dir)
    if df.empty:
        st.info("No window has finished yet.")
        return
    values = [v for v in ("val_token_auroc", "gen_factuality", "train_s") if v in df.columns]
    value = st.radio("Value", values, horizontal=True, key=K + "value",
                     persist_state="session", format_func=lambda v: VALUE_LABEL[v])
    left, right = st.columns(2)
    hm = heatmap_table(df, value)
    z = hm.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(z=z, x=[f"k={k}" for k in hm.columns], y=hm.index.tolist(), colorscale="Viridis",
                               text=np.where(np.isnan(z), "", np.vectorize(lambda v: f"{v:.3f}")(np.nan_to_num(z))),
                               texttemplate="%{text}", hoverongaps=False,
                               hovertemplate="start %{y} · %{x}<br>%{z:.3f}<extra></extra>",
                               colorbar=dict(title=VALUE_LABEL[value].split(" (")[0], thickness=12)))
    fig.update_layout(title=f"{VALUE_LABEL[value]} by window start × size", xaxis_title="window size",
                      yaxis_title="start layer", yaxis=dict(autorange="reversed"), height=420)
    with left:
        plot(fig, key=K + "heat")
    lines = lines_table(df, sorted(df["size"].unique()), value)
    lines["k"] = lines["size"].map(lambda k: f"k = {k}")
    fig2 = px.line(lines, x="start", y=value, color="k", markers=True, title="One line per window size",
                   labels={value: VALUE_LABEL[value], "start": "window start layer"})
    with right:
        plot(fig2, key=K + "lines")
    cols = [c for c in ("window", "start", "size", "end", "val_token_auroc", "val_tokens", "loss", "train_s",
                        "gen_factuality", "gen_sentences", "prefix_store_mb") if c in df.columns]
    st.dataframe(df[cols], hide_index=True, key=K + "table",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in ("val_token_auroc", "loss", "train_s", "gen_factuality")})
    csv_download(df, f"{Path(sel).name}.csv", key=K + "csv")


job = jobs.read_job(sweep_dir)
running = job is not None and job.active
st.fragment(panel, run_every=2 if running else None)()
with st.expander("Log"):
    st.code(jobs.log_tail(sweep_dir, 30) or "(empty)", language=None)
