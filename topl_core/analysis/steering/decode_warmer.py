"""The λ slider's warmer (slider.py): a thread that builds the compiled decode step of the documents the slider's
views show, so that their streams take it once built — it never generates. On a CPU the build is a child process
stopped while the app generates (inference/exported_decode.py); a step compiled in this process (a GPU's) waits until
the slider's engine is idle.

    warmer = DecodeWarmer(compiled, wait_idle)  `compiled`: whether it builds (None: as TOPL_COMPILED_DECODE says);
                                                `wait_idle()`: returns once the engine is idle (or closed)
    warmer.warm(session, document, gen, how)    build that document's step on the warmer thread, once
    warmer.warming() -> bool;  warmer.close()
    background_priority()                       the lowest CPU priority, for the calling thread and those it starts
                                                (the warmer, and the slider's work ahead)
    compiled_decode_wanted() -> bool            TOPL_COMPILED_DECODE=0: never; else (auto) once built
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Callable

from ...hardware.threads import one_core_for_this_thread
from ...inference.aot_packages import compiled_decode_wanted
from ...inference.exported_decode import ExportedDecoder
from ...inference.generate import GenerationConfig
from ...runtime.modes import SteerConfig
from ...runtime.session import SteeringSession

log = logging.getLogger(__name__)


def background_priority() -> None:
    """Give the calling thread, and the threads it starts from now on, the lowest CPU priority, and its torch work one
    core (hardware/threads.py: a second thread's OpenMP team slows every later stream): work done ahead yields the
    cores to what a person waits for. On Linux a thread has a priority of its own; elsewhere the call fails or does
    not exist, and the thread keeps the usual priority."""
    one_core_for_this_thread()
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


class DecodeWarmer:
    """See the module docstring: one per slider engine, its thread started on the first step asked for and ended when
    none is left."""

    def __init__(self, compiled: bool | None, wait_idle: Callable[[], None]):
        self._compiled, self._wait_idle = compiled, wait_idle
        self._lock = threading.Lock()  # guards everything below
        self._wants: OrderedDict[tuple, tuple] = OrderedDict()  # steps to build, the last asked for last
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failed: weakref.WeakSet[SteeringSession] = weakref.WeakSet()  # a failed build: logged once, not retried

    def warm(self, session: SteeringSession, document: str, gen: GenerationConfig, how: SteerConfig) -> None:
        """Have the warmer thread build the compiled decode step of `document`'s streams (the module docstring),
        unless it is built, does not apply, failed before or TOPL_COMPILED_DECODE=0. Nothing here waits for it:
        until it is built, streams decode eagerly."""
        wanted = compiled_decode_wanted() if self._compiled is None else self._compiled
        if not wanted or session in self._failed:
            return
        if session.decoder is not None and (
            not session.compiles_decode(gen, how) or session.decode_ready(document, gen, how)
        ):
            return
        with self._lock:
            if self._closed:
                return
            key = (id(session), document, gen, how)
            self._wants.pop(key, None)
            self._wants[key] = (session, document, gen, how)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._warm_all, name="topl-decode-warmer", daemon=True)
                self._thread.start()

    def _warm_all(self) -> None:
        """The warmer thread: the steps asked for, the last asked for first, one at a time; ends when none is left."""
        background_priority()  # and the compiler processes it starts: a slider move during the build gets the cores
        while True:
            with self._lock:
                if self._closed or not self._wants:
                    self._thread = None
                    return
                _, (session, document, gen, how) = self._wants.popitem(last=True)
            try:
                if session.decoder is None:
                    session.compile_decode(wait=False)  # a compiled step once built; eager until then
                if session in self._failed or not session.compiles_decode(gen, how):
                    continue
                if session.decode_ready(document, gen, how):
                    continue
                if not isinstance(session.decoder, ExportedDecoder):  # built in this process: not beside the streams
                    self._wait_idle()
                t = time.perf_counter()
                session.warm_decode(document, gen, how)
                log.info("compiled decode step ready for this document after %.1f s", time.perf_counter() - t)
            except Exception:
                self._failed.add(session)
                log.exception("building the compiled decode step failed: the slider decodes eagerly")

    def warming(self) -> bool:
        """Whether the warmer thread is building (or about to build) a step."""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """No step is built after the one in flight (which finishes; the thread then ends)."""
        with self._lock:
            self._closed = True
            self._wants.clear()
