"""Reproduce the paper: every training method trained on the same data with the paper's relative settings, measured
on the same held-out tokens and documents, and a report that sets this run's tables beside the paper's with a verdict
per claim — a study of tasks in a background process, with progress, ETA, stop and resume; the report shown here."""

from pages._ui.frame import core_imports, ensure_frame

ensure_frame()  # first: see pages/_ui/frame.py

import time
from pathlib import Path

import streamlit as st

from pages._ui.datasets import dataset_picker
from pages._ui.forms import SIDEBAR_FIELDS, config_inputs, field_input
from pages._ui.jobs import follow, job_log, job_row, pick_job
from pages._ui.spec import current_model_name, current_spec, split_spec
from topl_core.foundations.errors import ConfigError, WorkbenchError
from topl_core.foundations.executor import ExecutorConfig
from topl_core.foundations.paths import inside, runs_dir
from topl_core.foundations.presets import PRESETS
from topl_core.foundations.progress import format_seconds
from topl_core.jobs import launchers
from topl_core.jobs.background import JobStatus

with core_imports():
    from topl_core.analysis.studies.reproduce import read_tasks
    from topl_core.analysis.studies.reproduce_config import ReproduceConfig
    from topl_core.analysis.studies.reproduce_report import read_report

st.title("Reproduce the paper")
st.caption(
    "Every training method on the same data and split, each with the paper's own settings scaled to the model; then "
    "LoRA-A separability, factuality ID and OOD, λ curves, label sensitivity and token-level detection on the same "
    "held-out data, and a report with the paper's numbers beside this run's and a verdict per claim."
)

STUDIES = runs_dir() / "reproduce"
K = "repro."
DEFAULT = ReproduceConfig()
HAND_LAID = {"data", "preset", "methods", "steps"}
model, _, device = split_spec(current_spec())

with st.expander("Start a study", expanded=not STUDIES.is_dir() or not any(STUDIES.iterdir())):
    with st.form("repro.form", border=False):
        a, b, c, d = st.columns(4)
        name = a.text_input(
            "Study name",
            f"paper-{Path(model).name}-{time.strftime('%m%d-%H%M')}",
            key=K + "name",
            persist_state="session",
        )
        data = dataset_picker(K + "data", b)
        preset = c.selectbox(
            "Paper settings of",
            ["", *PRESETS],
            key=K + "preset",
            persist_state="session",
            format_func=lambda p: p or "the model's own family",
            help="the model family whose per-method paper settings are scaled to the sidebar's model",
        )
        steps = field_input(d, ReproduceConfig, "steps", K, DEFAULT.steps)
        methods = field_input(st, ReproduceConfig, "methods", K, DEFAULT.methods)
        with st.expander("More settings"):
            values = config_inputs(ReproduceConfig, st.columns(4), K, DEFAULT, skip=HAND_LAID | SIDEBAR_FIELDS)
        with st.expander("Where the tasks run"):
            executor_values = config_inputs(ExecutorConfig, st.columns(5), K + "executor.", ExecutorConfig())
        go = st.form_submit_button("Start study", type="primary", icon=":material/play_arrow:")
    if go:
        try:
            if not data:
                raise ConfigError("data: build a data set on the Data page first.")
            cfg = ReproduceConfig(
                model=current_model_name(),
                device=device,
                data=data,
                preset=preset,
                methods=methods,
                steps=steps,
                **values,
            )
            path = launchers.launch_reproduce(
                cfg, inside(STUDIES, name, "Study name"), ExecutorConfig(**executor_values)
            )
            st.session_state[K + "show"] = str(path.relative_to(runs_dir().resolve()))
            st.rerun()
        except (WorkbenchError, ValueError) as e:
            st.error(str(e))

# studies started here live in runs/reproduce/; the CLI's (reproduce --out runs/NAME) anywhere in runs/
found = [p for d in (STUDIES, runs_dir()) if d.is_dir() for p in d.iterdir() if (p / "reproduce.json").exists()]
studies = sorted(set(found), key=lambda p: -p.stat().st_mtime)
if not studies:
    st.info(
        "No study yet: start one above. On a 2-core CPU the full SmolLM2 study takes hours (docs/reproduce.md); "
        "`python -m topl_core reproduce --quick` shows every table in minutes on a tiny model."
    )
    st.stop()
sel = pick_job("Study", [str(p.relative_to(runs_dir())) for p in studies], K + "show")
folder = runs_dir() / sel


def panel(job: JobStatus | None) -> None:
    tasks = read_tasks(folder)
    done = int((tasks["state"] == "done").sum())
    eta = f" · about {format_seconds(job.eta_s)} left" if job and job.eta_s else ""
    now = f" · {job.current}" if job and job.current else ""
    text = f"{job.state if job else 'not started'} · {done}/{len(tasks)} tasks{now}{eta}"
    job_row(
        job,
        K,
        done / len(tasks),
        text,
        stop_help="Stops after the current step or task.",
        stopping="Stopping after the current step or task…",
        resume=launchers.resume_reproduce_job,
    )
    with st.expander(f"Tasks ({done} of {len(tasks)} done)", expanded=not (folder / "report.html").exists()):
        st.dataframe(
            tasks,
            hide_index=True,
            key=K + "tasks",
            column_config={"seconds": st.column_config.NumberColumn(format="%.0f")},
        )


follow(folder, K, panel)
if (folder / "report.html").exists():
    report = read_report(folder)
    st.subheader("Verdicts")
    st.dataframe(
        report["verdicts"],
        hide_index=True,
        key=K + "verdicts",
        column_order=["claim", "verdict", "this_run", "paper", "why"],
    )
    page = (folder / "report.html").read_text(encoding="utf-8")
    st.download_button(
        "Download the report (one HTML file)",
        page,
        file_name=f"{folder.name}.html",
        mime="text/html",
        key=K + "download",
        icon=":material/download:",
    )
    st.iframe(page, height=900)
job_log(folder)
