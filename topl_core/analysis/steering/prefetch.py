"""Work done ahead in one background thread, and dropped when the person moves elsewhere: the Steering page generates
the λ positions next to the one shown as one batch while the texts are read (SteeringSession.stream_grid with a
cancel event), so the next slider move reads them from its store — or, when the move comes first, shows the text
generated so far and waits for the rest instead of starting again.

    ahead = Prefetch()
    ahead.start(keys, stream, keep)   stream(cancel) yields, step after step, one value per key (the values so far), in
                                      a thread; at its end keep(key, value) for each one (nothing kept when
                                      cancelled); the job in flight is cancelled first
    ahead.writing(key) -> Event|None  the done-event of the job writing `key` (None: no job is writing it)
    ahead.partial(key)                the value of `key` so far (None before the first step)
    ahead.busy()                      whether a job is in flight
    ahead.cancel()                    stop the job in flight at its next decoder layer and wait for it
One job at a time: jobs share the model (and on a CPU, its cores) with what the page generates now, so a job runs at
the lowest CPU priority (background_priority): a page drawn meanwhile gets the cores first.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Sequence

from ...inference.generate import GenerationCancelled

log = logging.getLogger(__name__)


def background_priority() -> None:
    """Give the calling thread, and the threads it starts from now on (torch's OpenMP workers among them), the lowest
    CPU priority: work done ahead yields the cores to what a person waits for. On Linux a thread has a priority of
    its own; elsewhere the call fails or does not exist, and the thread keeps the usual priority."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


@dataclass
class _Job:
    keys: tuple
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    values: Sequence[object] | None = None  # the last step's
    thread: threading.Thread | None = None


class Prefetch:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: _Job | None = None
        # a job still generating when the interpreter exits is stopped first: a daemon thread frozen inside torch's
        # native code at shutdown aborts the process ("terminate called without an active exception")
        atexit.register(self.cancel)

    def start(
        self,
        keys: Sequence[Hashable],
        stream: Callable[[threading.Event], Iterator[Sequence[object]]],
        keep: Callable[[Hashable, object], None],
    ) -> None:
        """Run stream(cancel) in a background thread and, once it ends, keep(key, value) for the keys and its last
        values, in order; the job in flight is cancelled first, unless it is writing exactly these keys. An error in
        `stream` is logged, not raised: the page generates what it shows itself and reports its errors there."""
        keys = tuple(keys)
        with self._lock:
            if self._job is not None and not self._job.done.is_set() and self._job.keys == keys:
                return
            self._stop_locked()
            job = _Job(keys)

            def run() -> None:
                background_priority()
                try:
                    for job.values in stream(job.cancel):
                        pass
                    for key, value in zip(keys, job.values or (), strict=True):
                        keep(key, value)
                except GenerationCancelled:
                    pass
                except Exception:
                    log.exception("work ahead failed")
                finally:
                    job.done.set()

            job.thread = threading.Thread(target=run, name="topl-prefetch", daemon=True)
            self._job = job
            job.thread.start()

    def busy(self) -> bool:
        """Whether a job is in flight."""
        job = self._job
        return job is not None and not job.done.is_set()

    def writing(self, key: Hashable) -> threading.Event | None:
        """The done-event of the job writing `key` (set when its values are kept, or when it stopped), else None."""
        job = self._job
        return job.done if job is not None and key in job.keys and not job.done.is_set() else None

    def partial(self, key: Hashable) -> object | None:
        """The value of `key` so far in the job writing it (None before its first step, or when none writes it)."""
        job = self._job
        if job is None or key not in job.keys or job.values is None:
            return None
        return job.values[job.keys.index(key)]

    def cancel(self) -> None:
        """Stop the job in flight (at its next decoder layer) and wait until it has."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._job is not None and self._job.thread is not None:
            self._job.cancel.set()
            self._job.thread.join()
        self._job = None
