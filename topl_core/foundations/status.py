"""One status protocol for every long piece of work — a training run, a layer sweep, an evaluation, a label study —
whether it runs in the foreground (a CLI command) or as a background job (topl_core.jobs.background).

The work's folder holds:

    status.json   {"state", "updated", "pid", "pid_started", "error"?, "warnings"?, ...progress}: written atomically
                  by the work as it goes (training: step / steps; a sweep: done / total windows and the current
                  window), and by the job runner when the work ended without saying so (a crash before the first
                  write, a signal); pid_started: the writer's start time (with its pid, which process it is);
                  warnings: what went wrong without stopping the work (add_warning).
    STOP          a stop request: the work stops at its next check (training: after the current step, with a
                  checkpoint), sets state "cancelled", and the file is removed when the work is started again.
    LOCK          the single writer's pid, start time and host while it works (WriterLock): a second writer is
                  refused.

A process is known by its pid and its start time (psutil's create_time, on every OS): after a reboot, or in a
container, small pids come back, and a pid alone would name whatever process got it (`running`). The state shown to
people is read from these files and from whether the writing process still lives, by STATE_TABLE below — the same
function for the UI and the CLI (topl_core.jobs.background.read_job).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import psutil

from .errors import RunError
from .io import write_json

STATUS_FILE = "status.json"
STOP_FILE = "STOP"

State = Literal["starting", "running", "finished", "failed", "cancelled", "interrupted", "unknown"]
ACTIVE_STATES: tuple[State, ...] = ("starting", "running")
ENDED_STATES: tuple[State, ...] = ("finished", "failed", "cancelled", "interrupted")


def write_status(folder: str | Path, state: State, **fields) -> None:
    """Replace the folder's status (atomically) with `state`, this process's pid and start time (or the start time of
    the pid `fields` names), the time and `fields`; the warnings recorded so far (add_warning) are kept."""
    kept = {k: v for k, v in read_status(folder).items() if k == "warnings"}
    pid = int(fields.get("pid", os.getpid()))  # this process, or the one `fields` names (the job's)
    me = {"pid": pid, "pid_started": process_started(pid)}
    write_json(Path(folder) / STATUS_FILE, {"state": state, "updated": time.time(), **me, **kept, **fields})


def update_status(folder: str | Path, state: State, **fields) -> None:
    """Like write_status, keeping the fields already there (the progress of the work, and the pid and start time of
    the process that wrote them unless `fields` names another) — for the job runner and for the reader that finds a
    job dead."""
    kept = {k: v for k, v in read_status(folder).items() if k not in ("state", "updated")}
    if "pid" in fields and "pid_started" not in fields:  # another process named: its own start time goes with it
        fields["pid_started"] = process_started(int(fields["pid"]))
    write_status(folder, state, **{**kept, **fields})


def add_warning(folder: str | Path, message: str) -> None:
    """Record what went wrong without stopping the work (a tracker that failed mid-run) in status.json's "warnings",
    where the job list and the Runs page read it."""
    status = read_status(folder)
    update_status(folder, status.get("state", "running"), warnings=[*status.get("warnings", []), message])


def read_status(folder: str | Path) -> dict:
    """The folder's status.json, or {} when there is none (or it cannot be read: a partial copy)."""
    try:
        status = json.loads((Path(folder) / STATUS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return status if isinstance(status, dict) else {}


def request_stop(folder: str | Path) -> None:
    """Ask the work in `folder` to stop at its next check (a training step; a sweep's current window's step)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / STOP_FILE).touch()


def stop_requested(folder: str | Path) -> bool:
    return (Path(folder) / STOP_FILE).exists()


def clear_stop(folder: str | Path) -> None:
    (Path(folder) / STOP_FILE).unlink(missing_ok=True)


@dataclass(frozen=True)
class Facts:
    """What the files and the process table say about one piece of work."""

    alive: bool  # the process that runs it (the job's, or the one status.json names) still lives
    written: str | None  # the state in status.json
    stop_requested: bool
    launched: bool  # started as a background job (job.json exists)


# How the shown state follows from the facts: the first row that matches wins.
STATE_TABLE: tuple[tuple[str, Callable[[Facts], bool], Callable[[Facts], State]], ...] = (
    (
        "said it ended, in a process that is not a job's and lives on (a notebook, a script, the app)",
        lambda f: not f.launched and f.written in ENDED_STATES,
        lambda f: f.written,
    ),
    ("alive, and it has reported", lambda f: f.alive and f.written is not None, lambda f: "running"),
    ("alive, nothing reported yet", lambda f: f.alive, lambda f: "starting"),
    ("ended and said how", lambda f: f.written in ENDED_STATES, lambda f: f.written),
    ("gone after a stop request", lambda f: f.stop_requested, lambda f: "cancelled"),
    (
        "gone without a word (killed, machine restarted): resumable",
        lambda f: f.written == "running" or f.launched,
        lambda f: "interrupted",
    ),
    ("nothing to go on", lambda f: True, lambda f: "unknown"),
)


def resolve_state(facts: Facts) -> State:
    return next(state(facts) for _, matches, state in STATE_TABLE if matches(facts))


# Where each kind of work writes its progress in status.json: (done, total).
PROGRESS_FIELDS = (("step", "steps"), ("done", "total"))


def progress_of(status: dict) -> tuple[int, int]:
    """(done, total) from a status dict of any kind of work; (0, 0) when it has reported none."""
    for done, total in PROGRESS_FIELDS:
        if done in status:
            return int(status[done]), int(status.get(total, 0))
    return 0, 0


# --- one writer per folder ----------------------------------------------------------------------------------------

LOCK_FILE = "LOCK"


# The folders this process holds a WriterLock on: folder's LOCK path → (holding thread, depth). A nested
# WriterLock on the same folder in the same thread (a job around the trainer) is re-entrant; another thread of this
# process (a second app session) is refused like another process.
_HELD: dict[Path, tuple[int, int]] = {}
_HELD_GUARD = threading.Lock()
# A launcher that took a folder's lock passes it to the job process it starts through this environment variable;
# until that process takes it, the launcher knows the lock is that child's (LOCK path → child pid).
HANDOVER_ENV = "TOPL_LOCK_HANDOVER"
_HANDED: dict[Path, int] = {}


class WriterLock:
    """`with WriterLock(folder):` — the folder's single writer. A second writer is refused (RunError naming the
    holder's pid and host); the lock of a process that is gone (same host) is taken over. Released on exit.

    A launcher takes the lock, starts the process with `hand_over()`'s environment and tells `handed_to(pid)`: that
    process takes the lock with its own WriterLock, and no other writer slips in between the launch and the start
    of the work."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder).resolve() / LOCK_FILE
        self.me = {"pid": os.getpid(), "pid_started": process_started(os.getpid()), "host": socket.gethostname()}

    def __enter__(self) -> "WriterLock":
        with _HELD_GUARD:
            owner, depth = _HELD.get(self.path, (None, 0))
            if owner == threading.get_ident():
                _HELD[self.path] = (owner, depth + 1)
                return self
            self._acquire(held_by_other_thread=owner is not None)
            _HELD[self.path] = (threading.get_ident(), 1)
        return self

    def _acquire(self, held_by_other_thread: bool) -> None:
        self.created = not self.path.parent.exists()  # removed again if the work leaves nothing in it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                with open(self.path, "x", encoding="utf-8") as f:
                    json.dump(self.me, f)
                return
            except FileExistsError:
                holder = self._holder()
                token = os.environ.get(HANDOVER_ENV)
                handed_to_me = bool(token) and holder is not None and holder.get("handover") == token
                if handed_to_me and not held_by_other_thread:
                    write_json(self.path, self.me)  # atomic replace: no moment without a lock
                    return
                if held_by_other_thread or (holder is not None and self._alive(holder)):
                    holder = holder or {}
                    raise RunError(
                        f"{self.path.parent} is being written by pid {holder.get('pid')} on {holder.get('host')}; "
                        "wait for it to finish or stop it (Cancel, or python -m topl_core sweep --stop), or use "
                        "another output folder."
                    ) from None
                if holder is not None and holder.get("pid") != self.me["pid"]:  # not a lock this process left
                    warnings.warn(
                        f"{self.path.parent}: taking over the writer lock of pid {holder.get('pid')}, "
                        f"{gone_reason(holder.get('pid'))}.",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                self.path.unlink(missing_ok=True)  # a dead writer's lock (or an unreadable one): take it over
        raise RunError(f"{self.path}: could not take the writer lock; another process keeps taking it.")

    def __exit__(self, *exc) -> None:
        with _HELD_GUARD:
            owner, depth = _HELD.get(self.path, (None, 0))
            if owner != threading.get_ident():
                return  # handed over to another process
            if depth > 1:
                _HELD[self.path] = (owner, depth - 1)
                return
            del _HELD[self.path]
            holder = self._holder() or {}
            if (holder.get("pid"), holder.get("host")) == (self.me["pid"], self.me["host"]):
                self.path.unlink(missing_ok=True)
            if self.created and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()  # refused before writing anything: leave no empty folder behind

    def hand_over(self) -> dict[str, str]:
        """The environment for the process that is to take over this held lock (its WriterLock takes it)."""
        token = secrets.token_hex(16)
        write_json(self.path, {**self.me, "handover": token})
        return {HANDOVER_ENV: token}

    def handed_to(self, pid: int) -> None:
        """That process has started: the lock is its own now (held for it until it takes it), not this thread's."""
        with _HELD_GUARD:
            _HANDED[self.path] = pid
            _HELD.pop(self.path, None)

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text())
            return holder if isinstance(holder, dict) else None
        except (OSError, json.JSONDecodeError):
            return None

    def _alive(self, holder: dict) -> bool:
        if holder.get("host") != self.me["host"]:
            return True  # another machine's process: cannot tell, so it holds the lock
        if holder.get("pid") == self.me["pid"]:  # no thread of this process holds it: handed to a child, or left
            child = _HANDED.get(self.path)  # behind by a crash or by a child that died before taking it
            return child is not None and running(child)
        try:
            return running(int(holder["pid"]), holder.get("pid_started"))
        except (KeyError, TypeError, ValueError):
            return True  # a lock we cannot read the holder of: keep out


# --- which process ------------------------------------------------------------------------------------------------

# psutil's start time adds the boot time, which the kernel gives to the second and a clock step moves
SAME_START_S = 1.0


def process_started(pid: int) -> float | None:
    """When the process `pid` started (seconds since the epoch, psutil); None when there is none or it cannot be
    read."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def running(pid: int, started: float | None = None) -> bool:
    """The process `pid` lives (not a zombie waiting to be reaped) and, given its start time, is the very process
    that started then — not another that got its pid since (after a reboot, in a container). Without a start time
    (files written before it was recorded) any live process with the pid counts."""
    try:
        process = psutil.Process(int(pid))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - float(started)) <= SAME_START_S
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return False
    except psutil.AccessDenied:  # another user's process with this pid: it exists, its start cannot be compared
        return started is None


def gone_reason(pid) -> str:
    """Why the process a lock or a job names, found not running, does not count: it has ended, or its pid now belongs
    to another process (named, with its start)."""
    try:
        now = psutil.Process(int(pid))
        if now.status() == psutil.STATUS_ZOMBIE:
            return "which has ended"
        other = f"{now.name()}, started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now.create_time()))}"
    except (psutil.Error, ValueError, TypeError):
        return "which has ended"
    return f"which has ended: pid {pid} now belongs to another process ({other})"


# --- SIGTERM as a clean stop --------------------------------------------------------------------------------------


def stop_cleanly_on_sigterm() -> None:
    """Turn SIGTERM (what `kill`, a scheduler or a container stop sends) into KeyboardInterrupt, as Ctrl-C is: long
    work then takes its cancel path (the trainer checkpoints and writes "cancelled") instead of dying mid-step."""

    def handler(_signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the checkpoint
        raise KeyboardInterrupt("cancelled (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)
