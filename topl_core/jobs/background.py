"""Background jobs: training runs, layer sweeps, evaluations and label studies (any `python -m topl_core`
command) in detached processes, all read and stopped one way (topl_core.foundations.status).

A job is a directory. For training it is the run directory itself; for a sweep, the sweep directory:

    runs/<name>/
      job.json        what was launched: {kind, argv, pid, pid_started (the process's start: with the pid, which
                      process it is), started}
      job.log         the process's stdout + stderr
      status.json     the protocol's status (foundations/status.py): written by the work as it goes (the trainer: step
                      / steps; a sweep: done / total), and by the job process when the work ended without saying so
      STOP            a stop request (cancel writes it, then SIGTERMs the job)
      metrics.jsonl, topl_config.json, ...   written by the trainer (see topl_core.training.run_dirs)

State is read back from these files only (read_job, through topl_core.foundations.status's state table), so the job list
survives page reloads, app restarts and several app sessions at once. A job is started as
`python -m topl_core.cli.job_runner --job-dir DIR -- <cli args>` (job_runner.py) in a new session
(`start_new_session=True`, so it outlives the app and has its own process group). That entry point turns SIGTERM
into KeyboardInterrupt: Python's default SIGTERM action kills the process without unwinding, which would skip the
trainer's `except BaseException` path (checkpoint + status "cancelled"). Cancel = SIGTERM to the process group.

Training is launched as `train --resume RUN_DIR` after `RunDir.write_config(cfg)`: the trainer reads the exact
config from the run directory, starts from step 0 when there is no checkpoint, and resumes when there is one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import psutil

from ..foundations.errors import JobError, RunError, WorkbenchError
from ..foundations.io import write_json
from ..foundations.paths import PROJECT_ROOT, runs_dir
from ..foundations.status import (
    ACTIVE_STATES,
    Facts,
    State,
    WriterLock,
    clear_stop,
    gone_reason,
    process_started,
    progress_of,
    read_status,
    request_stop,
    resolve_state,
    running,
    stop_requested,
    update_status,
)
from ..training.run_dirs import RunDir

JOB_FILE = "job.json"
LOG_FILE = "job.log"

# Popen objects of the jobs this process started: polled so that finished children are reaped (a zombie still
# answers kill(pid, 0)). Jobs started by an earlier app process are not our children: init reaps them.
_CHILDREN: dict[int, subprocess.Popen] = {}
# Exit codes of reaped children (negative: killed by that signal), to say how a job died that could not say it.
_EXIT_CODES: dict[int, int] = {}


@dataclass(frozen=True)
class JobStatus:
    """Everything the UI shows about one job, read from its directory."""

    path: Path
    kind: str
    state: State
    step: int = 0
    steps: int = 0
    loss: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    pid: int | None = None
    started: float | None = None
    updated: float | None = None
    error: str | None = None
    val: dict = field(default_factory=dict)  # latest validation metrics (e.g. val_token_auroc)
    current: str | None = None  # what a sweep is training now (a window's name)
    warnings: tuple[str, ...] = ()  # what went wrong without stopping the work (status.add_warning)
    label: str = ""  # the path relative to the listed root ("baselines/sft"), set by list_jobs

    @property
    def name(self) -> str:
        return self.label or self.path.name

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.steps) if self.steps else 0.0


# --- launching --------------------------------------------------------------------------------------------


def launch(
    cli_args: Sequence[str],
    job_dir: str | Path,
    kind: str = "command",
    env: dict | None = None,
    info: dict | None = None,
) -> Path:
    """Start `python -m topl_core <cli_args>` detached, logging into job_dir/job.log. Returns job_dir. Refused
    (JobError) while another writer works in job_dir. `info`: what the launcher wants to read back (job_info)."""
    with claim(job_dir) as lock:
        return start_claimed(cli_args, lock, kind, env, info)


@contextmanager
def claim(job_dir: str | Path) -> Iterator[WriterLock]:
    """Hold job_dir's writer lock while a launch prepares it; `start_claimed` hands it to the job process. Two sessions
    launching into the same folder at once: one starts, the other gets a JobError naming the holder."""
    lock = WriterLock(job_dir)
    try:
        lock.__enter__()
    except RunError as e:
        raise JobError(str(e)) from None
    try:
        yield lock
    finally:
        lock.__exit__(None, None, None)  # nothing left to release once handed over


def start_claimed(
    cli_args: Sequence[str], lock: WriterLock, kind: str, env: dict | None, info: dict | None = None
) -> Path:
    job_dir = lock.path.parent  # a job still working here holds this lock, so claim refused this launch already
    clear_stop(job_dir)
    argv = [sys.executable, "-m", "topl_core.cli.job_runner", "--job-dir", str(job_dir), "--", *map(str, cli_args)]
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), **lock.hand_over()}
    with open(job_dir / LOG_FILE, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv[3:])}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=PROJECT_ROOT,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lock.handed_to(proc.pid)
    _CHILDREN[proc.pid] = proc
    argv_str = list(map(str, cli_args))
    write_json(
        job_dir / JOB_FILE,
        {
            "kind": kind,
            "argv": argv_str,
            "pid": proc.pid,
            "pid_started": process_started(proc.pid),
            "started": time.time(),
            "info": info or {},
        },
    )
    return job_dir


def job_info(job_dir: str | Path) -> dict:
    """The `info` its launcher stored with a job (empty for none)."""
    return (_read_json(Path(job_dir) / JOB_FILE) or {}).get("info") or {}


def job_argv(job_dir: str | Path) -> list[str]:
    """The command line a job runs, as `python -m topl_core <argv>` (empty for none)."""
    return (_read_json(Path(job_dir) / JOB_FILE) or {}).get("argv") or []


def cancel(job_dir: str | Path) -> bool:
    """Stop the work in job_dir: a STOP request (the trainer and a sweep stop after the current step, with a
    checkpoint), and for a background job also SIGTERM to its process group (work that does not check STOP, such
    as an evaluation, ends at once; the trainer's SIGTERM path checkpoints too). Works for a run started from the
    command line as well. False when nothing is running there."""
    job = read_job(job_dir)
    if job is None or not job.active:
        return False
    already = stop_requested(job_dir)
    request_stop(job_dir)
    info = _read_json(Path(job_dir) / JOB_FILE)
    if info and not already and process_alive(info.get("pid"), info.get("pid_started")):
        try:
            os.killpg(int(info["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass
    return True


def wait(job_dir: str | Path, timeout_s: float = 600, poll_s: float = 0.2) -> JobStatus:
    """Block until the job is no longer active (tests, scripts). Returns its final status."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = read_job(job_dir)
        if st is None or not st.active or time.monotonic() > deadline:
            return st
        time.sleep(poll_s)


# --- reading state ----------------------------------------------------------------------------------------


ETA_WINDOW = 20  # steps whose mean duration predicts the rest


def read_job(job_dir: str | Path) -> JobStatus | None:
    """The state of the work in job_dir (a background job, a run, a sweep) from its files; None when the directory
    holds none."""
    job_dir = Path(job_dir)
    info = _read_json(job_dir / JOB_FILE)
    is_run = RunDir(job_dir).config_path.exists()
    status = read_status(job_dir)
    if info is None and not is_run and not status:
        return None
    # a job's process is the one job.json names; work started elsewhere (a command line, a notebook, a script) is
    # known by the process its status names
    named = info if info is not None else status
    pid, pid_started = named.get("pid"), named.get("pid_started")
    facts = Facts(
        alive=process_alive(pid, pid_started),
        written=status.get("state"),
        stop_requested=stop_requested(job_dir),
        launched=info is not None,
    )
    state = resolve_state(facts)
    error = status.get("error")
    if state == "interrupted" and not error:
        error = _silent_death(job_dir, pid, pid_started)
    step, steps = progress_of(status)
    if is_run and state == "interrupted":  # died mid-way: what survives is its last checkpoint
        step = RunDir(job_dir).checkpoint_step()
    metrics = RunDir(job_dir).read_metrics() if is_run else []
    if is_run and not steps:
        steps = _configured_steps(RunDir(job_dir))
    val = next(
        (
            {k: v for k, v in r.items() if k.startswith("val_")}
            for r in reversed(metrics)
            if any(k.startswith("val_") for k in r)
        ),
        {},
    )
    # the last logged loss: a finished run's status no longer carries one
    loss = next((r["loss"] for r in reversed(metrics) if "loss" in r), status.get("loss"))
    step_s = [r["step_s"] for r in metrics if "step_s" in r]
    elapsed = sum(step_s) if step_s else None  # training time over every (re)start, validation excluded
    recent = step_s[-ETA_WINDOW:]
    eta = sum(recent) / len(recent) * (steps - step) if (recent and steps and state == "running") else None
    if eta is None and state == "running":  # a study of tasks says its own (topl_core.analysis.studies.reproduce)
        eta = status.get("eta_s")
    kind = (info or {}).get("kind", "train" if is_run else "sweep" if (job_dir / "sweep.json").exists() else "command")
    return JobStatus(
        job_dir,
        kind,
        state,
        step,
        steps,
        loss,
        elapsed,
        eta,
        pid,
        (info or {}).get("started"),
        status.get("updated"),
        error,
        val,
        current=status.get("current"),
        warnings=tuple(status.get("warnings", ())),
    )


def _configured_steps(run: RunDir) -> int:
    try:
        return run.read_config()[0].steps
    except WorkbenchError:
        return 0


def list_jobs(root: str | Path | None = None) -> list[JobStatus]:
    """Every run / job directory under root (default runs_dir()), newest first: its direct children, and the
    children of a plain folder that groups runs (e.g. runs/baselines/sft). A sweep's per-window runs are not
    listed (they belong to the sweep)."""
    root = Path(root) if root is not None else runs_dir()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        if st := read_job(d):
            out.append(replace(st, label=d.name))
        elif not (d / "sweep.json").exists():
            out += [
                replace(st, label=f"{d.name}/{c.name}")
                for c in sorted(d.iterdir())
                if c.is_dir() and not c.name.startswith(".") and (st := read_job(c))
            ]
    return sorted(out, key=lambda s: -(s.started or s.updated or _mtime(s.path)))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _silent_death(job_dir: Path, pid, pid_started: float | None = None) -> str:
    """Why a job that said nothing about its end is gone, as far as this process can tell. When the job was our
    child its exit code is known: that is written to status.json, so every app session sees the same cause."""
    resume = "resume continues from the last checkpoint"
    rc = _EXIT_CODES.get(int(pid)) if pid else None
    if rc is None:
        if pid and pid_started is not None and "another process" in (why := gone_reason(pid)):
            return f"the job process (pid {pid}) ended without reporting, {why}; {resume}"
        return f"the job process ended without reporting (killed, or the machine restarted?); {resume}"
    if rc < 0:
        name = signal.Signals(-rc).name
        hint = " — out of memory?" if name == "SIGKILL" else ""
        error = f"the job process was killed by {name}{hint} (see {LOG_FILE}); {resume}"
    else:
        error = f"the job process exited with code {rc} without reporting (see {LOG_FILE}); {resume}"
    update_status(job_dir, "interrupted", returncode=rc, ended=time.time(), error=error)
    return error


def log_tail(job_dir: str | Path, lines: int = 20) -> str:
    path = Path(job_dir) / LOG_FILE
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 16_000))
        return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def process_alive(pid, started: float | None = None) -> bool:
    """True while the process exists and is not a zombie, and is the process that started at `started` (its
    psutil start time, recorded beside the pid): a pid that now belongs to another process, after a restart or in a
    container, does not count, whatever that process is. Where no start time was recorded (files of older versions)
    a live process counts when its command line names topl_core."""
    if not pid:
        return False
    pid = int(pid)
    if pid in _CHILDREN:  # our own child: its exit status is the truth
        if (rc := _CHILDREN[pid].poll()) is None:
            return True
        _EXIT_CODES[pid] = rc
        del _CHILDREN[pid]
        return False
    if started is not None or not running(pid):
        return running(pid, started)
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
    # Empty while the kernel is still setting up a fresh exec (seen in about 1 of 4 reads right after Popen returns):
    # that process is alive and not yet identifiable.
    return not cmdline or "topl_core" in cmdline
