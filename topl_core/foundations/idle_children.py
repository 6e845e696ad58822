"""Child processes that take only the time the app leaves idle (a compiled decode step's build: inference/
exported_decode.py).

    with idle_child(popen): ...   while the child (started with start_new_session=True: a process group of its own)
        runs, it is stopped whenever this process is busy
    with busy(): ...              this process is busy: every idle child is stopped (SIGSTOP to its process group),
        and goes on (SIGCONT) once nothing is busy. The Steering page's eager generation and every page's script run
        are busy (runtime/session.py, pages/_ui/frame.py); the slider's work ahead is not
        (background_thread(): it runs at the lowest priority beside the build, which it would otherwise starve).

The lowest CPU priority alone was not enough: on 2 cores, beside a build at nice 19, the Steering page drew a λ written
ahead several times slower than without the build (docs/performance.md, "Figures behind the code's choices"): the
children's threads still take the cores between the page's parallel regions and share the memory bandwidth a decode step
is bound by.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterator

_LOCAL = threading.local()  # .background: the thread's busy() is no busy (background_thread)
_LOCK = threading.Lock()  # guards the two below
_CHILDREN: set[int] = set()  # the process groups of the idle children running
_BUSY = 0  # how many busy() are open in this process


def background_thread() -> None:
    """The calling thread's work is background work too (the slider's work ahead, at the lowest priority): its busy()
    stops no idle child, so that work no one waits for does not starve a build that someone will (the build and it
    share the cores, both at the lowest priority)."""
    _LOCAL.background = True


@contextmanager
def busy() -> Iterator[None]:
    """This process is busy while inside: the idle children are stopped (see the module docstring); from a
    background_thread(), nothing."""
    global _BUSY
    if getattr(_LOCAL, "background", False):
        yield
        return
    with _LOCK:
        _BUSY += 1
        if _BUSY == 1:
            _signal(_CHILDREN, signal.SIGSTOP)
    try:
        yield
    finally:
        with _LOCK:
            _BUSY -= 1
            if _BUSY == 0:
                _signal(_CHILDREN, signal.SIGCONT)


@contextmanager
def idle_child(child: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """`child` (the leader of its own process group) is an idle child while inside: stopped now if this process is
    busy, and whenever it becomes so."""
    with _LOCK:
        _CHILDREN.add(child.pid)
        if _BUSY:
            _signal({child.pid}, signal.SIGSTOP)
    try:
        yield child
    finally:
        with _LOCK:
            _CHILDREN.discard(child.pid)
        _signal({child.pid}, signal.SIGCONT)  # a child left stopped would never end


def _signal(groups: set[int], sig: signal.Signals) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:  # ended meanwhile
            pass
