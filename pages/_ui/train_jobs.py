"""The Train page's live runs: each recent run's state and progress with Cancel or Resume, then the chosen run's loss
and validation curves and its log. Everything is read from the run directories (topl_core.jobs.background), so it
survives reloads and app restarts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from pages._ui.figures import training_curves
from pages._ui.render import csv_download, plot
from topl_core.foundations.paths import runs_dir
from topl_core.jobs import background, launchers
from topl_core.training.run_dirs import RunDir

KEY = "train."  # the Train page's widget keys
SHOWN = 8  # runs listed; the Runs page has the rest
STATE_ICON = {
    "starting": ":gray[:material/hourglass_top:]",
    "running": ":blue[:material/play_circle:]",
    "finished": ":green[:material/check_circle:]",
    "failed": ":red[:material/error:]",
    "cancelled": ":gray[:material/stop_circle:]",
    "interrupted": ":orange[:material/warning:]",
    "unknown": ":gray[:material/help:]",
}


def duration(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def train_jobs_panel() -> None:
    """The training runs, newest first (reruns the app when the last active one ends, so the run lists refresh)."""
    all_jobs = [j for j in background.list_jobs() if j.kind == "train"]
    active = [j for j in all_jobs if j.active]
    if st.session_state.get(KEY + "had_active") and not active:
        st.session_state[KEY + "had_active"] = False
        st.rerun(scope="app")  # a job just ended: stop polling, refresh the run lists
    st.session_state[KEY + "had_active"] = bool(active)
    st.subheader(f"Runs ({len(active)} active)")
    if not all_jobs:
        st.info(f"No runs yet in `{runs_dir()}`.")
        return
    for j in all_jobs[:SHOWN]:
        job_card(j)
    if len(all_jobs) > SHOWN:
        st.caption(f"… and {len(all_jobs) - SHOWN} older runs (see the Runs page).")
    names = [j.name for j in all_jobs]
    watch = Path(st.session_state.get(KEY + "watch", "")).name
    if st.session_state.get(KEY + "detail") not in names:
        st.session_state[KEY + "detail"] = watch if watch in names else (active[0].name if active else names[0])
    chosen = runs_dir() / st.selectbox("Curves of", names, key=KEY + "detail", persist_state="session")
    curves(chosen)
    with st.expander("Log"):
        st.code(background.log_tail(chosen, 30) or "(empty)", language=None)


def job_card(j: background.JobStatus) -> None:
    """One run: its state, progress (ETA while it runs, validation AUROC once it ended), Cancel or Resume, its error
    and warnings."""
    loss = "—" if j.loss is None else f"{j.loss:.4f}"
    with st.container(border=True):
        a, b, c = st.columns([3, 6, 1.3], vertical_alignment="center")
        a.markdown(f"{STATE_ICON.get(j.state, '')} **{j.name}**  \n`{j.state}`")
        if j.active:
            eta, elapsed = duration(j.eta_s), duration(j.elapsed_s)
            b.progress(j.fraction, text=f"step {j.step}/{j.steps} · ETA {eta} · elapsed {elapsed} · loss {loss}")
            if c.button("Cancel", key=f"train.cancel.{j.name}", icon=":material/stop:"):
                background.cancel(j.path)
                st.toast(f"Cancelling {j.name}: saving a checkpoint…")
        else:
            auroc = j.val.get("val_token_auroc")
            shown_auroc = f" · val token AUROC {auroc:.3f}" if auroc is not None else ""
            b.progress(j.fraction, text=f"step {j.step}/{j.steps} · loss {loss}{shown_auroc}")
            if j.state in ("cancelled", "failed", "interrupted"):
                resume_button(j, c)
            if j.error and j.state != "finished":
                b.caption(f"{j.error[:300]}")
        for warning in j.warnings:  # a tracker that failed mid-run: the run went on
            b.caption(f":orange[:material/warning:] {warning}")


def resume_button(j: background.JobStatus, container) -> None:
    """Resume a run that stopped before its last step, from its last checkpoint, and follow it."""
    if container.button("Resume", key=f"train.resume.{j.name}", icon=":material/replay:"):
        try:
            launchers.resume_train(j.path)
            st.session_state[KEY + "watch"] = str(j.path)
            st.rerun(scope="app")
        except background.JobError as e:
            st.error(str(e))


def curves(path: Path) -> None:
    """A run's loss and validation curves, and its metrics as CSV."""
    rows = RunDir(path).read_metrics()
    if not rows:
        st.caption("No metrics yet: the process is loading the model and data.")
        return
    metrics = pd.DataFrame(rows)
    plot(training_curves(metrics), key=f"train.curves.{path.name}")
    csv_download(metrics, f"{path.name}-metrics.csv", key=f"train.csv.{path.name}", label="Metrics CSV")
