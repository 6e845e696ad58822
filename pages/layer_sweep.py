"""Layer sweep: TOPL trained with LoRA on a sliding window of layers [s, s+k) (head after the window), for a grid
of (start, size), in a background process. The (start × size) heatmap and the k-lines fill in as windows finish;
the sweep is resumable (finished windows are kept)."""

from pages._ui.frame import core_imports, ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import time
from pathlib import Path

import plotly.express as px
import streamlit as st

from pages._ui.datasets import dataset_paths
from pages._ui.forms import SIDEBAR_FIELDS, config_inputs, field_input, precision_select
from pages._ui.jobs import follow, job_log, job_row, pick_job
from pages._ui.models import layer_count_or_stop
from pages._ui.render import csv_download, plot
from pages._ui.spec import current_spec, split_spec
from topl_core.foundations.errors import ConfigError
from topl_core.foundations.executor import ExecutorConfig
from topl_core.foundations.paths import inside, runs_dir
from topl_core.jobs import background, launchers
from topl_core.training.config import TrainConfig, study_schedule

with core_imports():
    from topl_core.analysis.figures import heatmap
    from topl_core.analysis.studies.sweep_results import heatmap_table, lines_table, read_sweep
    from topl_core.analysis.studies.sweeps import SweepConfig, plan_windows

st.title("Layer sweep")
st.caption(
    "Which layers should carry the LoRA? TOPL is trained on windows of k consecutive layers starting at s, "
    "and each window is scored by its head's token AUROC on the validation split."
)

spec = current_spec()
model_name, _, device = split_spec(spec)
n_layers = layer_count_or_stop(spec)
SWEEPS = runs_dir() / "sweeps"
K = "sweep."
SWEEP = SweepConfig()  # every input starts at SweepConfig's default; a window's training at its template, .train
# Laid out by hand below (the grid depends on the model's layers); every other field of SweepConfig, and of the
# TrainConfig (with its LoraSettings) that a window trains with, gets a generated input, so a field added to either
# appears in this form (as in the Train form) without an edit here. tests/test_app.py checks it.
HAND_LAID = {"sizes", "stride", "data", "steps", "lr", "batch_size", "max_doc_tokens", "precision"}
NOT_ASKED = {
    "train",  # its fields are asked one by one
    "windows",  # explicit windows instead of sizes × stride: the CLI's --windows
    "method",  # a sweep trains TOPL
    "layer_start",
    "layer_end",  # the window's
    "eval_every",
    "checkpoint_every",  # follow the steps, as in the CLI: validate at the window's end
    "beta",
    "tdpo_alpha",  # losses of other methods (DPO, TDPO)
    "probe_layers",  # side probes: each window's own layers would differ; the Train form asks them
}

with st.expander("Start a sweep", expanded=not SWEEPS.is_dir() or not any(SWEEPS.iterdir())):
    with st.form("sweep.form", border=False):
        a, b, c, d = st.columns(4)
        name = a.text_input(
            "Sweep name",
            f"sweep-{Path(model_name).name}-{time.strftime('%m%d-%H%M')}",
            key=K + "name",
            persist_state="session",
        )
        data = b.selectbox(
            "Data set", dataset_paths(), key=K + "data", persist_state="session", format_func=lambda p: Path(p).name
        )
        default_sizes = [k for k in SWEEP.sizes if k <= n_layers] or [max(1, n_layers // 2)]
        sizes = field_input(c, SweepConfig, "sizes", K, default_sizes, options=list(range(1, n_layers + 1)))
        stride = field_input(d, SweepConfig, "stride", K, min(SWEEP.stride, n_layers), max_value=n_layers)
        a, b, c, d, e = st.columns(5)
        steps = field_input(a, TrainConfig, "steps", K, SWEEP.train.steps, label="Steps per window")
        lr = field_input(b, TrainConfig, "lr", K, SWEEP.train.lr)
        batch = field_input(c, TrainConfig, "batch_size", K, SWEEP.train.batch_size)
        max_doc = field_input(d, TrainConfig, "max_doc_tokens", K, SWEEP.train.max_doc_tokens)
        precision = precision_select(e, K + "precision", device)
        sweep_values = config_inputs(SweepConfig, st.columns(4), K, SWEEP, skip=HAND_LAID | NOT_ASKED)
        with st.expander("More training settings (every window)"):
            train_values = config_inputs(
                TrainConfig, st.columns(4), K, SWEEP.train, skip=HAND_LAID | NOT_ASKED | SIDEBAR_FIELDS
            )
        with st.expander("Where the windows run"):
            executor_values = config_inputs(ExecutorConfig, st.columns(5), K + "executor.", ExecutorConfig())
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
            train = study_schedule(
                TrainConfig(
                    model=model_name,
                    data=str(Path(data).resolve()),
                    steps=steps,
                    lr=lr,
                    batch_size=batch,
                    precision=precision,
                    device=device,
                    max_doc_tokens=max_doc,
                    **train_values,
                )
            )
            cfg = SweepConfig(train=train, sizes=tuple(sorted(sizes)), stride=stride, **sweep_values)
            path = launchers.launch_sweep(cfg, inside(SWEEPS, name, "Sweep name"), ExecutorConfig(**executor_values))
            st.session_state[K + "show"] = str(path.relative_to(runs_dir().resolve()))
            st.rerun()
        except (ConfigError, background.JobError, ValueError) as e:
            st.error(str(e))

# sweeps started here live in runs/sweeps/; the CLI's (python -m topl_core sweep --out runs/NAME) anywhere in runs/
found = [p for d in (SWEEPS, runs_dir()) if d.is_dir() for p in d.iterdir() if (p / "sweep.json").exists()]
sweeps = sorted(set(found), key=lambda p: -p.stat().st_mtime)
if not sweeps:
    st.info(
        "No sweep yet: start one above. On a CPU a tiny grid (e.g. k = 3, stride 6, 10 steps) takes minutes "
        "with SmolLM2; the page fills in as windows finish."
    )
    st.stop()
sel = pick_job("Sweep", [str(p.relative_to(runs_dir())) for p in sweeps], K + "show")
sweep_dir = runs_dir() / sel
VALUE_LABEL = {
    "val_token_auroc": "head token AUROC (val)",
    "gen_factuality": "generation factuality",
    "train_s": "training time (s)",
}


def panel(job: background.JobStatus | None) -> None:
    done, total = (job.step, job.steps) if job else (0, 0)
    cur = f" · training {job.current}" if job and job.current else ""
    job_row(
        job,
        K,
        done / total if total else 0.0,
        f"{job.state if job else 'unknown'} · {done}/{total} windows{cur}",
        stop_help="Stops after the current step; the window keeps a checkpoint and the sweep can resume.",
        stopping="Stopping after the current step…",
        resume=launchers.resume_sweep_job,
    )

    df = read_sweep(sweep_dir)
    if df.empty:
        st.info("No window has finished yet.")
        return
    values = [v for v in ("val_token_auroc", "gen_factuality", "train_s") if v in df.columns]
    value = st.radio(
        "Value", values, horizontal=True, key=K + "value", persist_state="session", format_func=lambda v: VALUE_LABEL[v]
    )
    left, right = st.columns(2)
    hm = heatmap_table(df, value)
    fig = heatmap(
        hm,
        f"{VALUE_LABEL[value]} by window start × size",
        x=[f"k={k}" for k in hm.columns],
        hover="start %{y} · %{x}<br>%{z:.3f}",
        colorbar=VALUE_LABEL[value].split(" (")[0],
        decimals=3,
        height=420,
        axis_titles=("window size", "start layer"),
    )
    with left:
        plot(fig, key=K + "heat")
    lines = lines_table(df, sorted(df["size"].unique()), value)
    lines["k"] = lines["size"].map(lambda k: f"k = {k}")
    fig2 = px.line(
        lines,
        x="start",
        y=value,
        color="k",
        markers=True,
        title="One line per window size",
        labels={value: VALUE_LABEL[value], "start": "window start layer"},
    )
    with right:
        plot(fig2, key=K + "lines")
    cols = [
        c
        for c in (
            "window",
            "start",
            "size",
            "end",
            "val_token_auroc",
            "val_tokens",
            "loss",
            "train_s",
            "gen_factuality",
            "gen_sentences",
            "prefix_store_mb",
        )
        if c in df.columns
    ]
    st.dataframe(
        df[cols],
        hide_index=True,
        key=K + "table",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f")
            for c in ("val_token_auroc", "loss", "train_s", "gen_factuality")
        },
    )
    csv_download(df, f"{Path(sel).name}.csv", key=K + "csv")


follow(sweep_dir, K, panel)
job_log(sweep_dir)
