"""The one background-job panel, for every kind of job a page starts (a training run, a layer sweep, an evaluation, a
reproduction study, a deck, a data build): the job picker, the progress bar with Stop (or Cancel) while the job runs and
Resume once it stopped early, what a job that ended badly said, its log, and the fragment that follows a job while it
runs and reruns the page once when it ends. Every kind is read, stopped and resumed one way (topl_core.jobs: read_job,
cancel, the typed launchers); a page says only what its bar reads and which launcher resumes it. Widget and session
keys start with the page's prefix (`key`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import streamlit as st

from topl_core.jobs import background
from topl_core.jobs.background import JobStatus

STOPPED_EARLY = ("cancelled", "failed", "interrupted")  # the states Resume continues from


def pick_job(label: str, names: Sequence[str], key: str, format_func: Callable[[str], str] = str) -> str:
    """The job to show: the one named in session_state[key] (a launch sets it) while it is listed, else the first
    (the newest)."""
    if st.session_state.get(key) not in names:
        st.session_state[key] = names[0]
    return st.selectbox(label, names, key=key, persist_state="session", format_func=format_func)


def rerun_when_ended(key: str, active: bool) -> None:
    """Rerun the whole page once when what was active at the last run no longer is: the page's lists and results
    refresh and its fragment stops polling."""
    was = st.session_state.get(key + "job_active")
    st.session_state[key + "job_active"] = active
    if was and not active:
        st.rerun(scope="app")


def follow(job_dir: Path, key: str, body: Callable[[JobStatus | None], None], every: float = 2.0) -> None:
    """`body(job)` for the job in job_dir, as a fragment that reruns every `every` seconds while the job is active (and
    the whole page once when it ends)."""
    job = background.read_job(job_dir)

    def fragment() -> None:
        now = background.read_job(job_dir)
        rerun_when_ended(key, now is not None and now.active)
        body(now)

    st.fragment(fragment, run_every=every if job is not None and job.active else None)()


def job_row(
    job: JobStatus | None,
    key: str,
    fraction: float,
    text: str,
    *,
    stop: str = "Stop",
    stop_help: str | None = None,
    stopping: str | None = None,
    resume: Callable[[Path], object] | None = None,
    where: Sequence | None = None,
) -> None:
    """A job's progress bar (`fraction`, `text`) and beside it `stop` (a stop request, then `stopping` as a toast)
    while the job runs, or Resume (`resume`: the kind's typed launcher) once it stopped early; under the bar, its error
    and its warnings. `where`: the bar's and the button's containers (default: a row of two columns)."""
    bar, button = where if where is not None else st.columns([5, 1], vertical_alignment="center")
    bar.progress(min(max(fraction, 0.0), 1.0), text=text)
    if job is None:
        return
    if job.active:
        if button.button(stop, key=key + stop.lower(), icon=":material/stop:", help=stop_help):
            background.cancel(job.path)
            if stopping:
                st.toast(stopping)
    elif resume is not None and job.state in STOPPED_EARLY:
        if button.button("Resume", key=key + "resume", icon=":material/replay:"):
            try:
                resume(job.path)
                st.rerun(scope="app")
            except background.JobError as e:
                st.error(str(e))
    if job.error and job.state != "finished":
        bar.caption(job.error[:300])
    for warning in job.warnings:  # what went wrong without stopping the work (a tracker that failed mid-run)
        bar.caption(f":orange[:material/warning:] {warning}")


def job_failure(job_dir: Path, message: str, lines: int = 20, warn: bool = False) -> None:
    """A job that ended badly: `message` as an error (a warning where starting it again continues it) and the end of
    its log."""
    (st.warning if warn else st.error)(message)
    st.code(background.log_tail(job_dir, lines) or "(empty log)", language=None)


def job_log(job_dir: Path, lines: int = 30, command: bool = False) -> None:
    """The job's log in an expander; with `command`, the command line it runs above it."""
    with st.expander("Command and log" if command else "Log"):
        if command:
            st.code("python -m topl_core " + " ".join(background.job_argv(job_dir)), language="bash")
        st.code(background.log_tail(job_dir, lines) or "(empty)", language=None)
