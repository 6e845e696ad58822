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
from pages._ui.spec import current_model_name, current_spec, split_spec
from topl_core.foundations.errors import ConfigError, WorkbenchError
from topl_core.foundations.executor import ExecutorConfig
from topl_core.foundations.paths import inside, runs_dir
from topl_core.foundations.presets import PRESETS
from topl_core.foundations.progress import format_seconds
from topl_core.jobs import background as jobs
from topl_core.jobs import launchers

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
names = [str(p.relative_to(runs_dir())) for p in studies]
if st.session_state.get(K + "show") not in names:
    st.session_state[K + "show"] = names[0]
sel = st.selectbox("Study", names, key=K + "show", persist_state="session")
folder = runs_dir() / sel


def panel() -> None:
    job = jobs.read_job(folder)
    state = job.state if job else "not started"
    active = job is not None and job.active
    if st.session_state.get(K + "was_running") and not active:
        st.session_state[K + "was_running"] = False
        st.rerun(scope="app")  # the study ended: stop polling, show the report
    st.session_state[K + "was_running"] = active
    tasks = read_tasks(folder)
    done = int((tasks["state"] == "done").sum())
    eta = f" · about {format_seconds(job.eta_s)} left" if job and job.eta_s else ""
    now = f" · {job.current}" if job and job.current else ""
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    c1.progress(done / len(tasks), text=f"{state} · {done}/{len(tasks)} tasks{now}{eta}")
    if active:
        if c2.button("Stop", key=K + "stop", icon=":material/stop:", help="Stops after the current step or task."):
            jobs.cancel(folder)
            st.toast("Stopping after the current step or task…")
    elif state in ("cancelled", "failed", "interrupted") and c2.button(
        "Resume", key=K + "resume", icon=":material/replay:"
    ):
        try:
            launchers.resume_reproduce_job(folder)
            st.rerun(scope="app")
        except jobs.JobError as e:
            st.error(str(e))
    if job and job.error and state != "finished":
        st.caption(job.error[:300])
    with st.expander(f"Tasks ({done} of {len(tasks)} done)", expanded=not (folder / "report.html").exists()):
        st.dataframe(
            tasks,
            hide_index=True,
            key=K + "tasks",
            column_config={"seconds": st.column_config.NumberColumn(format="%.0f")},
        )


job = jobs.read_job(folder)
st.fragment(panel, run_every=2 if job is not None and job.active else None)()
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
with st.expander("Log"):
    st.code(jobs.log_tail(folder, 30) or "(empty)", language=None)
