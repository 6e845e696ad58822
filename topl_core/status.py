"""One status protocol for every long piece of work — a training run, a layer sweep, an evaluation, a label study —
whether it runs in the foreground (a CLI command) or as a background job (topl_core.jobs).

The work's folder holds:

    status.json   {"state", "updated", "pid", "error"?, ...progress}: written atomically by the work as it goes
                  (training: step / steps; a sweep: done / total windows and the current window), and by the job
                  runner when the work ended without saying so (a crash before the first write, a signal).
    STOP          a stop request: the work stops at its next check (training: after the current step, with a
                  checkpoint), sets state "cancelled", and the file is removed when the work is started again.
    LOCK          the single writer's pid and host while it works (WriterLock): a second writer is refused.

The state shown to people is read from these files and from whether the writing process still lives, by
STATE_TABLE below — the same function for the UI and the CLI (topl_core.jobs.read_job).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from .errors import RunError
from .io import write_json

STATUS_FILE = "status.json"
STOP_FILE = "STOP"

State = Literal["starting", "running", "finished", "failed", "cancelled", "interrupted", "unknown"]
ACTIVE_STATES: tuple[State, ...] = ("starting", "running")
ENDED_STATES: tuple[State, ...] = ("finished", "failed", "cancelled", "interrupted")


def write_status(folder: str | Path, state: State, **fields) -> None:
    """Replace the folder's status (atomically) with `state`, this process's pid, the time and `fields`."""
    write_json(Path(folder) / STATUS_FILE, {"state": state, "updated": time.time(), "pid": os.getpid(), **fields})


def update_status(folder: str | Path, state: State, **fields) -> None:
    """Like write_status, keeping the fields already there (the progress of the work, and the pid of the process
    that wrote them unless `fields` names another) — for the job runner and for the reader that finds a job dead."""
    kept = {k: v for k, v in read_status(folder).items() if k not in ("state", "updated")}
    write_status(folder, state, **{**kept, **fields})


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

    alive: bool  # the process that runs it (the job's, or the pid in status.json) still lives
    written: str | None  # the state in status.json
    stop_requested: bool
    launched: bool  # started as a background job (job.json exists)


# How the shown state follows from the facts: the first row that matches wins.
STATE_TABLE: tuple[tuple[str, Callable[[Facts], bool], Callable[[Facts], State]], ...] = (
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


class WriterLock:
    """`with WriterLock(folder):` — the folder's single writer. A second writer is refused (RunError naming the
    holder's pid and host); the lock of a process that is gone (same host) is taken over. Released on exit."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / LOCK_FILE
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}

    def __enter__(self) -> "WriterLock":
        self.created = not self.path.parent.exists()  # removed again if the work leaves nothing in it
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                with open(self.path, "x", encoding="utf-8") as f:
                    json.dump(self.me, f)
                return self
            except FileExistsError:
                holder = self._holder()
                if holder is not None and self._alive(holder):
                    raise RunError(
                        f"{self.path.parent} is being written by pid {holder.get('pid')} on {holder.get('host')}; "
                        "wait for it to finish or stop it (Cancel, or python -m topl_core sweep --stop), or use "
                        "another output folder."
                    ) from None
                self.path.unlink(missing_ok=True)  # a dead writer's lock (or an unreadable one): take it over
        raise RunError(f"{self.path}: could not take the writer lock; another process keeps taking it.")

    def __exit__(self, *exc) -> None:
        if self._holder() == self.me:
            self.path.unlink(missing_ok=True)
        if self.created and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()  # refused before writing anything: leave no empty folder behind

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text())
            return holder if isinstance(holder, dict) else None
        except (OSError, json.JSONDecodeError):
            return None

    def _alive(self, holder: dict) -> bool:
        if holder.get("host") != self.me["host"]:
            return True  # another machine's process: cannot tell, so it holds the lock
        if holder.get("pid") == self.me["pid"]:
            return False  # this very process left it behind (a crash in an earlier call)
        try:
            return pid_exists(int(holder["pid"]))
        except (KeyError, TypeError, ValueError):
            return True  # a lock we cannot read the holder of: keep out


def pid_exists(pid: int) -> bool:
    """A process with this pid exists (possibly another user's); a zombie still counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- SIGTERM as a clean stop --------------------------------------------------------------------------------------


def stop_cleanly_on_sigterm() -> None:
    """Turn SIGTERM (what `kill`, a scheduler or a container stop sends) into KeyboardInterrupt, as Ctrl-C is: long
    work then takes its cancel path (the trainer checkpoints and writes "cancelled") instead of dying mid-step."""

    def handler(_signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt the checkpoint
        raise KeyboardInterrupt("cancelled (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)
