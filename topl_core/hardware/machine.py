"""The machine a measurement comes from, and how its probes time a kernel.

    machine_key()             the probes' cache key (CPU, instruction set, torch build, threads)
    machine_description()     the machine as the docs name it (the GPU, or the CPU's model, cores, instruction set)
    best_time(fn)             the best of PROBE_REPEATS timed calls, after an untimed warm-up
    one_thread()              torch's CPU kernels on one thread for a while (a probe per core, steady under load)

The probes that use them: precision.py (bf16 against float32) and linear_kernel.py (aten's against oneDNN's linear).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import time
import typing

import torch

PROBE_REPEATS = 5


def best_time(fn: typing.Callable[[], object]) -> float:
    """The best of PROBE_REPEATS timed calls of `fn` after one untimed warm-up (kernel selection, allocation), in
    seconds (never 0): what the machine probes measure."""
    fn()
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


@contextlib.contextmanager
def one_thread() -> typing.Iterator[None]:
    """torch's CPU kernels on one thread inside: a probe then compares per core, and stays steady when another job
    shares the CPU (threads waiting on a busy core skew a multi-threaded one: docs/models.md, "The probe")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def machine_key() -> str:
    """The machine probes' cache key: what decides their answers (CPU, instruction set, torch build, threads)."""
    raw = "|".join(
        [
            platform.processor() or platform.machine(),
            _cpu_model(),
            torch.backends.cpu.get_cpu_capability(),
            torch.__version__,
            str(torch.get_num_threads()),
        ]
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_description(device: str = "cpu") -> str:
    """The machine a result comes from, as the docs name it: the GPU, or the CPU's model, cores and instruction set."""
    if device == "cuda" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (GPU)"
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    capability = torch.backends.cpu.get_cpu_capability() + (", AMX" if amx else "")
    return f"{_cpu_model()}, {os.cpu_count()} cores ({capability})"
