"""The training loop's clock: time spent training since this (re)start, validation and checkpoints excluded, for the
logged throughput and the ETA."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


class TrainingClock:
    """Training time since this (re)start, validation and checkpoints excluded: elapsed_s and tokens_per_s count
    from the start, step_s and step_tokens are the last step's alone."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.excluded = 0.0
        self.elapsed = 0.0
        self.tokens = 0

    def step(self, tokens: int) -> dict:
        elapsed = time.perf_counter() - self.t0 - self.excluded
        row = {
            "elapsed_s": elapsed,
            "tokens_per_s": (self.tokens + tokens) / elapsed,
            "step_s": elapsed - self.elapsed,
            "step_tokens": tokens,
        }
        self.elapsed, self.tokens = elapsed, self.tokens + tokens
        return row

    @contextmanager
    def overhead(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t

    def eta(self, steps_done: int, steps_left: int) -> float:
        return self.wall() / steps_done * steps_left

    def wall(self) -> float:
        return time.perf_counter() - self.t0
