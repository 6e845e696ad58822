"""A background thread's share of the cores for torch's CPU kernels.

    one_core_for_this_thread()   this thread's torch operations (and a compiled step's) run on its own core alone
    release_this_threads_team()  this thread's OpenMP workers end (a later parallel region of it starts a new team)

Why: torch's OpenMP runtime (libgomp) gives every thread that runs parallel work a team of its own, and once the
process holds more OpenMP threads than the machine has cores it stops spinning between parallel regions and sleeps
in the kernel instead — for every thread, also after the extra team has gone idle. On 2 cores, a slider's work ahead
run on a second thread made the stream a person asked for 1.7x slower from then on (a decode step's hundreds of
parallel regions each paying a wake-up: docs/performance.md, "The slider on the page"). A background thread that runs
its parallel regions on one thread creates no team, and leaves the other core to the browser and the server.
A thread that hands the model to another for good (the service's main thread, once its batcher's thread runs every
forward) releases the team it made while loading: kept, it throttled the batcher's every step (SmolLM2's two-row
compiled step 45 ms in the batcher's thread against 30 in the thread that loaded it, 28 once that one released its
team; 2-core Zen 4 EPYC, docs/performance.md, "The service's compiled step").
"""

from __future__ import annotations

import ctypes
import logging
import re
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

OPENMP_LIBRARY = re.compile(r"lib(g|i)?omp[\w.-]*\.so")  # libgomp (torch's own on Linux), libiomp5, libomp
OMP_PAUSE_SOFT = 1  # OpenMP's omp_pause_soft: the calling thread's idle workers end, its settings stay


@cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch's kernels run on (the one torch ships, else the one loaded), or None."""
    shipped = [p for p in sorted(Path(torch.__file__).parent.joinpath("lib").iterdir()) if OPENMP_LIBRARY.match(p.name)]
    loaded = [line.split()[-1] for line in _maps() if OPENMP_LIBRARY.match(line.rsplit("/", 1)[-1])]
    for path in [*map(str, shipped), *loaded]:
        try:
            lib = ctypes.CDLL(path)
            lib.omp_set_num_threads  # noqa: B018 (an OpenMP runtime has it)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _maps() -> list[str]:
    try:
        return Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux
        return []


def one_core_for_this_thread() -> None:
    """Run the calling thread's parallel torch work on this thread alone (OpenMP's per-thread thread count; torch's
    set_num_threads would change it for every thread started afterwards). Without an OpenMP runtime found, nothing
    changes (said once in the log)."""
    torch.get_num_threads()  # torch sets a new thread's count at its first parallel work: before ours, not after
    lib = _openmp()
    if lib is None:
        log.info("no OpenMP runtime found: a background thread's torch work keeps every core")
        return
    lib.omp_set_num_threads(1)


def release_this_threads_team() -> None:
    """End the calling thread's idle OpenMP workers (OpenMP 5's omp_pause_resource_all, soft): where another thread
    runs the model from now on, so that the process holds one team, not two (the module docstring). Call it outside
    any parallel region; a later parallel region of this thread starts a new team. Without an OpenMP runtime that
    has it, nothing changes."""
    lib = _openmp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return
    lib.omp_pause_resource_all(OMP_PAUSE_SOFT)
