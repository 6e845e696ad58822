"""Progress for long commands: a bar with an ETA redrawn in place on a terminal, periodic lines in a log.

Core functions take plain callbacks (`progress(done, total)` for counted work, `progress(message)` for stages) and
never print; the CLI passes a `Bar`, which is both. On a terminal the bar is redrawn at most 5 times a second; when
stderr is a file or pipe (job logs, CI) it writes a full line every `log_every_s` seconds or every 10% of the work,
and at the end, so a log shows progress without a flood of carriage returns.

    bar = Bar("scoring test split")
    scorer.score(records, progress=bar)        # calls bar(done, total) per batch
    bar.close()

    bar = Bar("evaluate", total=3)             # stages: each message starts the next stage
    evaluate(variants, cfg, progress=bar.stage)
"""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

BAR_WIDTH = 24
COUNTED = re.compile(r"\[[#.]{%d}\] (\d+)/(\d+) " % BAR_WIDTH)  # the count of a counted Bar.line(), read back


def format_seconds(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def bar_count(line: str) -> tuple[int, int] | None:
    """(done, total) of a counted Bar line ("desc [####....] 16/240  7% …", as a job's log holds it), else None."""
    m = COUNTED.search(line)
    return (int(m[1]), int(m[2])) if m else None


class Bar:
    """A progress bar with elapsed time and ETA (mean time per unit so far × units left)."""

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        stream: TextIO | None = None,
        log_every_s: float = 30.0,
        tty: bool | None = None,
    ):
        self.desc, self.total, self.done = desc, total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every_s = log_every_s
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._next_fraction = 0.1
        self._stages = 0
        self._open_line = False
        self._printed: tuple | None = None  # (done, total) of the last log line: never the same line twice

    # --- counted work: bar(done, total) ---------------------------------------------------------------------
    def __call__(self, done: int, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        self.done = done
        self._report(final=self.total is not None and done >= self.total)

    def update(self, n: int = 1) -> None:
        self(self.done + n)

    # --- stages: bar.stage(message) ---------------------------------------------------------------------------
    def stage(self, message: str) -> None:
        """A new stage begins (the previous one, if any, is done): print the message, then the bar."""
        if self._stages:
            self.done += 1
        self._stages += 1
        self.note(message)
        self._report(final=False, force=True)

    def note(self, message: str) -> None:
        """A line of its own above the bar."""
        self._end_line()
        print(message, file=self.stream, flush=True)

    def close(self) -> None:
        """The work is over: the last stage is done; draw the final state and end the line."""
        if self._stages and self.total is not None:
            self.done = max(self.done, min(self.total, self._stages))
        self._report(final=True, force=True)
        self._end_line()

    # --- drawing -----------------------------------------------------------------------------------------------
    def eta_s(self) -> float | None:
        if not self.total or not self.done:
            return None
        return (time.perf_counter() - self.t0) / self.done * max(0, self.total - self.done)

    def line(self) -> str:
        elapsed = format_seconds(time.perf_counter() - self.t0)
        if not self.total:
            return f"{self.desc}: {self.done} done, {elapsed} elapsed"
        frac = min(1.0, self.done / self.total)
        filled = int(round(frac * BAR_WIDTH))
        eta = self.eta_s()
        tail = f"ETA {format_seconds(eta)}" if eta is not None and frac < 1 else "done" if frac >= 1 else "ETA …"
        return (
            f"{self.desc} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} "
            f"{100 * frac:3.0f}%  {elapsed} elapsed, {tail}"
        )

    def _report(self, final: bool, force: bool = False) -> None:
        now = time.perf_counter()
        if self.tty:
            if force or final or now - self._last_draw >= 0.2:
                print("\r" + self.line() + "\033[K", end="", file=self.stream, flush=True)
                self._open_line, self._last_draw = True, now
            return
        frac = self.done / self.total if self.total else 0.0
        due = force or final or now - self._last_draw >= self.log_every_s or frac >= self._next_fraction
        if due and (self.done, self.total) != self._printed:
            print(self.line(), file=self.stream, flush=True)
            self._last_draw, self._printed = now, (self.done, self.total)
            while self._next_fraction <= frac:
                self._next_fraction += 0.1

    def _end_line(self) -> None:
        if self._open_line:
            print(file=self.stream, flush=True)
            self._open_line = False

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
