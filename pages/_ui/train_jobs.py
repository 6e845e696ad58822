"""The Train page's live runs: each recent run's state and progress with Cancel or Resume (the job panel's row,
pages/_ui/jobs.py), then the chosen run's loss and validation curves and its log. Everything is read from the run
directories (topl_core.jobs.background), so it survives reloads and app restarts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from pages._ui.figures import training_curves
from pages._ui.jobs import job_log, job_row, rerun_when_ended
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
    rerun_when_ended(KEY, bool(active))  # a job just ended: stop polling, refresh the run lists
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
    job_log(chosen)


def job_card(j: background.JobStatus) -> None:
    """One run: its state, progress (ETA while it runs, validation AUROC once it ended), Cancel or Resume, its error
    and warnings."""
    loss = "—" if j.loss is None else f"{j.loss:.4f}"
    with st.container(border=True):
        a, b, c = st.columns([3, 6, 1.3], vertical_alignment="center")
        a.markdown(f"{STATE_ICON.get(j.state, '')} **{j.name}**  \n`{j.state}`")
        if j.active:
            text = f"step {j.step}/{j.steps} · ETA {duration(j.eta_s)} · elapsed {duration(j.elapsed_s)} · loss {loss}"
        else:
            auroc = j.val.get("val_token_auroc")
            shown_auroc = f" · val token AUROC {auroc:.3f}" if auroc is not None else ""
            text = f"step {j.step}/{j.steps} · loss {loss}{shown_auroc}"
        stopping = f"Cancelling {j.name}: saving a checkpoint…"
        job_row(j, f"{KEY}{j.name}.", j.fraction, text, stop="Cancel", stopping=stopping, resume=resume, where=(b, c))


def resume(path: Path) -> None:
    """Resume a run that stopped before its last step, from its last checkpoint, and follow it."""
    launchers.resume_train(path)
    st.session_state[KEY + "watch"] = str(path)


def curves(path: Path) -> None:
    """A run's loss and validation curves, and its metrics as CSV."""
    rows = RunDir(path).read_metrics()
    if not rows:
        st.caption("No metrics yet: the process is loading the model and data.")
        return
    metrics = pd.DataFrame(rows)
    plot(training_curves(metrics), key=f"train.curves.{path.name}")
    csv_download(metrics, f"{path.name}-metrics.csv", key=f"train.csv.{path.name}", label="Metrics CSV")
