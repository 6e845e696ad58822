"""hardware/threads.py: a thread's share of torch's OpenMP workers, observed as the process's threads (in a fresh
interpreter, whose threads are torch's alone)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topl_core.hardware.threads import OPENMP_LIBRARY, _openmp

COUNT_THREADS = """
import os, threading, torch
from topl_core.hardware.threads import one_core_for_this_thread, release_this_threads_team
torch.set_num_threads(2)
threads = lambda: len(os.listdir("/proc/self/task"))
work = lambda: torch.ones(4_000_000).add_(1)  # an OpenMP region on every core torch has (an exp may be MKL's own)
start = threads()
work()
loaded = threads()  # this thread's team: its workers now wait for the next region
release_this_threads_team()
released = threads()
work()
again = threads()

def background():
    one_core_for_this_thread()
    work()
    seen.append(threads())

seen = []
release_this_threads_team()
t = threading.Thread(target=background)
t.start(); t.join()
print(start, loaded, released, again, seen[0] - 1)  # the background thread itself counted in seen
"""


@pytest.mark.skipif(_openmp() is None, reason="no OpenMP runtime found in torch's libraries")
def test_a_released_team_ends_its_workers_and_a_one_core_thread_starts_none():
    out = subprocess.run([sys.executable, "-c", COUNT_THREADS], capture_output=True, text=True, check=True).stdout
    start, loaded, released, again, background = map(int, out.split())
    assert loaded == start + 1  # the second core's worker
    assert released == start  # gone: the next thread that runs the model is the process's one team
    assert again == loaded  # a later region of the same thread starts a team again
    assert background == start  # a one-core thread's region makes no team


def test_the_openmp_library_pattern_names_runtimes_only():
    assert all(OPENMP_LIBRARY.match(n) for n in ("libgomp.so.1", "libgomp-a34b3233.so.1", "libiomp5.so", "libomp.so"))
    assert not any(OPENMP_LIBRARY.match(n) for n in ("libbackend_with_compiler.so", "libtorch_cpu.so"))
