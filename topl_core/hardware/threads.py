"""A background thread's share of the cores for torch's CPU kernels.

    one_core_for_this_thread()   this thread's torch operations (and a compiled step's) run on its own core alone

Why: torch's OpenMP runtime (libgomp) gives every thread that runs parallel work a team of its own, and once the
process holds more OpenMP threads than the machine has cores it stops spinning between parallel regions and sleeps
in the kernel instead — for every thread, also after the extra team has gone idle. On 2 cores, a slider's work ahead
run on a second thread made the stream a person asked for 1.7x slower from then on (a decode step's hundreds of
parallel regions each paying a wake-up: docs/performance.md, "The slider on the page"). A background thread that runs
its parallel regions on one thread creates no team, and leaves the other core to the browser and the server.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)


@cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch's kernels run on (the one torch ships, else the one loaded), or None."""
    shipped = sorted(Path(torch.__file__).parent.joinpath("lib").glob("lib*omp*.so*"))
    loaded = [line.split()[-1] for line in _maps() if "omp" in line.rsplit("/", 1)[-1]]
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
