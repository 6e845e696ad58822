"""Who reads the λ slider (slider.py) and the stream each has in flight: a reader's new stream stops its previous
one, and a reader that has asked for something else already (a page's next run) stops it at once.

    Readers()
        .start(reader, moved_on=None) -> event   the new stream's cancel event (the reader's previous one is set);
                                                 reader None: a stream nobody else cancels
        .end(reader, event)                      the stream is over
"""

from __future__ import annotations

import threading
from typing import Callable, Hashable


class Reading(threading.Event):
    """A reader's stream in flight: set when the reader's next stream starts, and read as set as soon as `moved_on()`
    says the reader has asked for something else (a page's new run waiting for this one to stop)."""

    def __init__(self, moved_on: Callable[[], bool] | None = None):
        super().__init__()
        self._moved_on = moved_on

    def is_set(self) -> bool:
        return super().is_set() or (self._moved_on is not None and self._moved_on())


class Readers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reading: dict[Hashable, Reading] = {}  # reader -> the cancel event of its stream in flight

    def start(self, reader: Hashable | None, moved_on: Callable[[], bool] | None = None) -> Reading:
        cancel = Reading(moved_on)
        if reader is not None:
            with self._lock:
                previous = self._reading.get(reader)
                if previous is not None:
                    previous.set()  # the reader moved on: its stream in flight stops at its next decoder layer
                self._reading[reader] = cancel
        return cancel

    def end(self, reader: Hashable | None, cancel: Reading) -> None:
        if reader is not None:
            with self._lock:
                if self._reading.get(reader) is cancel:
                    del self._reading[reader]
