"""Timing primitives of the benchmarks: the best time of several functions measured in turns, one call timed with a
GPU's queue drained, a GPU's wait, and the matmul peak that MFU is counted against."""

from __future__ import annotations

import time
from typing import Callable

import torch


def best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best time of each function after one warm-up call, run in turns (a, b, a, b, …) so that a burst of load
    elsewhere hits every side of a ratio alike."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def matmul_peak_tflops(
    dtype: torch.dtype, device: str = "cpu", max_n: int = 2048, repeats: int = 5, budget_s: float = 1.0
) -> float:
    """Best TFLOP/s of square matmuls (2·n³ FLOPs each) on `device`, doubling n from 256 up to max_n while one
    matmul takes under budget_s; each size timed after a warm-up, a GPU's waited for."""
    n, best = 256, 0.0
    while True:
        a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
        t = best_times({"matmul": lambda: sync(device, a @ b)}, repeats)["matmul"]
        best = max(best, 2 * n**3 / t / 1e12)
        if n >= max_n or 8 * t > budget_s:  # the next size costs 8× as much
            return best
        n *= 2


def timed(device: str, work: Callable[[], object]) -> tuple[object, float]:
    """work()'s result and its seconds, the device's queue drained before and after."""
    sync(device)
    t = time.perf_counter()
    out = work()
    sync(device)
    return out, time.perf_counter() - t


def sync(device: str, result: object = None) -> object:
    """Wait until a GPU has done what it was given (a CPU has when the call returns); returns `result`."""
    if device == "cuda":
        torch.cuda.synchronize()
    return result
