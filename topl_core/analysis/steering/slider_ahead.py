"""One job of the λ slider's work ahead (slider.py): the positions of one view to write in the background, what is
written of them so far, and how the job is stopped — and the writing itself, run on the slider's work-ahead thread.

    AheadJob(session, document, gen, how, lams, keys, keep)
        .write(store)              write the positions `store` does not hold yet: λ by λ (one λ, a mode that does not
                                   batch rows, or the compiled step), else as one batch; each finished text kept with
                                   keep(λ, text, replace=False); GenerationCancelled once .cancel is set
        .half_written(key, n)      whether half of `key`'s n tokens are written (a reader waits for the rest)
        .again()                   the same positions as a fresh job (after one paused for a reader)
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Callable, Hashable

from ...inference.generate import GenerationCancelled, GenerationConfig
from ...runtime.modes import SteerConfig
from ...runtime.session import SteeringSession
from ...runtime.steered_text import SteeredText
from .slider_texts import TextStore


@dataclass
class AheadJob:
    """Positions of one view written ahead (the module docstring)."""

    session: SteeringSession
    document: str
    gen: GenerationConfig
    how: SteerConfig
    lams: tuple[float, ...]
    keys: tuple
    keep: Callable[..., None]  # the view's: keep(λ, text, replace=False) keeps a finished text
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    paused: bool = False  # cancelled to yield to a stream: run again after it
    values: dict = field(default_factory=dict)  # key -> the text so far
    tokens: dict = field(default_factory=dict)  # key -> how many tokens of it are written

    def half_written(self, key: Hashable, max_new_tokens: int) -> bool:
        """Whether at least half of `key`'s text is written: waiting for the rest on the work ahead's one core beats
        writing it again at full speed; before that, a reader writes it itself."""
        return 2 * self.tokens.get(key, 0) >= max_new_tokens

    def again(self) -> AheadJob:
        return dataclasses.replace(
            self, cancel=threading.Event(), done=threading.Event(), paused=False, values={}, tokens={}
        )

    def write(self, store: TextStore) -> None:
        todo = [(lam, key) for lam, key in zip(self.lams, self.keys) if store.get(key) is None]
        if not todo or self.cancel.is_set():
            return
        session, document, gen, how = self.session, self.document, self.gen, self.how
        # λ by λ where a batch buys nothing: one λ, a mode that does not batch rows, or the compiled step (one row)
        if len(todo) == 1 or not how.spec.batches_rows or session.decode_ready(document, gen, how):
            for lam, key in todo:
                if self.cancel.is_set():
                    raise GenerationCancelled()
                g = SteeredText("")
                for n, g in enumerate(session.stream_generations(document, lam, gen, how=how, cancel=self.cancel), 1):
                    self.values[key], self.tokens[key] = g, n
                self.keep(lam, g, replace=False)
            return
        lams = [lam for lam, _ in todo]
        for n, texts in enumerate(session.stream_grid(document, lams, gen, how=how, cancel=self.cancel), 1):
            for (_, key), g in zip(todo, texts, strict=True):
                self.values[key], self.tokens[key] = g, n
        for lam, key in todo:
            self.keep(lam, self.values[key], replace=False)
