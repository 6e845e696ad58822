"""The λ slider's engine (the Steering page's, and any other reader's: the CLI, a notebook, the HTTP service): the
texts it has written, the positions it writes ahead while a text is read, the compiled decode step it has built for a
document, and the streams of the λ a person asks for — without Streamlit, one engine per process shared by every
reader and session (they share the models and, on a CPU, the cores).

    slider = shared_slider()                   the process's engine (or Slider(): one of its own, e.g. in a test)
    view = slider.view(name, session, document, gen, how, merged=None, reader=None, moved_on=None)
        the slider of one steering session (`name`: what it is built from, a key of its texts) on one document under
        one GenerationConfig and SteerConfig; asks the engine to build the compiled decode step for it now
        (Slider.warm). `merged`: what the merged text depends on (default `name`): the text at the neutral λ is the
        merged model's, written once per document and shared by every mode. `reader`: who reads (a browser session):
        a reader's new stream cancels its stream in flight; `moved_on()`: whether the reader has asked for something
        else already (read at every decoder layer and token: its stream stops at once, not when the next one starts),
        or it raises the reader's own interruption there (the Steering page's: Streamlit's rerun)
    view.stream(lam) -> Iterator[SteeredText]  the text at λ: at once where it is written; where the work ahead has
        written half of it or more, its text so far (every 0.1 s) until it is done; else streamed token by token at
        full speed (the work ahead, on one core, yields meanwhile: cancelled, then resumed after) and kept. Raises
        GenerationCancelled when the reader's next stream cancelled it. Close it (or let it run out) before the reader
        generates again: it holds the model's lock
    view.text(lam) -> SteeredText | None       the finished text, if written;  view.writing(lam): being written ahead
    view.ahead(lams)                           write the positions of `lams` not written yet in the background
    view.every(lams) -> {λ: SteeredText}       every position, those not written as one batch, now (the λ curve)
    view.decode_ready() -> bool                its new tokens come from the compiled decode step now
    slider.base(name, lm, document, gen, lock=None) -> Iterator[SteeredText]   the base model's text, once per document
    slider.base_text(name, document, gen) -> SteeredText | None                   that text, if written
    slider.warm(session, document, gen, how)   build the compiled decode step for `document`'s streams on the warmer
        thread (compile_decode(wait=False), then warm_decode), once; TOPL_COMPILED_DECODE=0: never (decode_warmer.py)
    with slider.paused(): ...                  the work ahead yields while inside (then resumes)
    neighbours(positions, lam) -> [λ]          the positions either side of the one nearest `lam` (slider_texts.py)

Threads: the work ahead runs on ONE background thread per engine (started on the first view.ahead, kept), at the
lowest CPU priority (background_priority): one job at a time, the last asked for; a job for other positions replaces
the one in flight (cancelled at its next decoder layer, nothing kept); a stream a reader asks for pauses it (cancelled,
then run again once no stream is asked for). It writes a grid as one batch (SteeringSession.stream_grid) until the
compiled step is built for the document, then λ by λ through that step (faster than the eager batch). The compiled step
is built on a second thread, the warmer (decode_warmer.py; it never generates): on a CPU its build is a child process
stopped while the app generates (inference/exported_decode.py); a step compiled in this process (a GPU's) waits until
the engine is idle. Finished texts are kept in an LRU store shared by every view and reader (slider_texts.TextStore).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from typing import Callable, ContextManager, Hashable, Iterator, Sequence

from ...foundations.idle_children import background_thread
from ...inference.generate import GenerationCancelled, GenerationConfig, stream_generate
from ...models.loading import LoadedModel
from ...runtime.modes import SteerConfig
from ...runtime.session import SteeringSession
from ...runtime.steered_text import SteeredText
from .decode_warmer import DecodeWarmer, background_priority
from .slider_ahead import AheadJob
from .slider_readers import Readers
from .slider_texts import STORE_SIZE, TextStore, neighbours  # noqa: F401 (neighbours: the Steering page's, from here)

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often a stream waiting on work ahead yields the text so far (a page redraws, a move can stop it)
YIELD_WAIT_S = 10.0  # the longest a stream waits for the work ahead to stop (it stops within a decoder layer)


class Slider:
    """See the module docstring. `compiled`: whether views build and take the compiled decode step (None: as
    TOPL_COMPILED_DECODE says, read at each request)."""

    def __init__(self, size: int = STORE_SIZE, compiled: bool | None = None):
        self.store = TextStore(size)
        self._cond = threading.Condition()  # guards everything below
        self._pending: AheadJob | None = None  # the next job (the last asked for, or one paused)
        self._current: AheadJob | None = None  # the job in flight
        self._asked = 0  # streams a reader asked for, in flight: the work ahead waits while any is
        self._worker: threading.Thread | None = None  # the one thread that writes ahead
        self._closed = False
        self.readers = Readers()  # who reads, and the stream each has in flight
        self.warmer = DecodeWarmer(compiled, self._wait_idle)  # builds the compiled decode step on its own thread
        # work in flight when the interpreter exits is stopped first: a daemon thread frozen inside torch's native
        # code at shutdown aborts the process ("terminate called without an active exception")
        atexit.register(self.close)

    # --- views -------------------------------------------------------------------------------------------------
    def view(
        self,
        name: Hashable,
        session: SteeringSession,
        document: str,
        gen: GenerationConfig,
        how: SteerConfig = SteerConfig(),
        merged: Hashable | None = None,
        reader: Hashable | None = None,
        moved_on: Callable[[], bool] | None = None,
    ) -> SliderView:
        """The slider of `session` on `document` (the module docstring); the compiled step's build is asked for now."""
        view = SliderView(self, name, session, document, gen, how, name if merged is None else merged, reader, moved_on)
        self.warm(session, document, gen, how)
        return view

    def base(
        self, name: Hashable, lm: LoadedModel, document: str, gen: GenerationConfig, lock: ContextManager | None = None
    ) -> Iterator[SteeredText]:
        """The base model `lm`'s text (`name`: what it is, a key of its text) as it is written, once per document:
        at once where written before. `lock` is held while it generates (the model's, where others share it)."""
        key = ("base", name, gen, document)
        done = self.store.get(key)
        if done is not None:
            yield done
            return
        with self.paused(), lock or contextlib.nullcontext():
            g = SteeredText("")
            with contextlib.closing(stream_generate(lm, document, gen)) as parts:
                for text in parts:
                    g = SteeredText(text)
                    yield g
        self.store.put(key, g)

    def base_text(self, name: Hashable, document: str, gen: GenerationConfig) -> SteeredText | None:
        """The base model's text written by base(name, …, document, gen), or None."""
        return self.store.get(("base", name, gen, document))

    # --- the work ahead ---------------------------------------------------------------------------------------
    def _ahead(self, view: SliderView, lams: Sequence[float]) -> None:
        todo = tuple(dict.fromkeys(round(float(lam), 6) for lam in lams if self.store.get(view.key(lam)) is None))
        if not todo:
            return
        job = AheadJob(
            view.session, view.document, view.gen, view.how, todo, tuple(view.key(lam) for lam in todo), view._keep
        )
        with self._cond:
            if self._closed:
                return
            current, pending = self._current, self._pending
            if current is not None and current.keys == job.keys and not current.cancel.is_set():
                return  # being written
            if pending is not None and pending.keys == job.keys:
                return  # about to be written
            if current is not None:
                current.cancel.set()  # other positions: dropped at its next decoder layer (a paused one not resumed)
            self._pending = job
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="topl-slider-ahead", daemon=True)
                self._worker.start()
            self._cond.notify_all()

    def _work(self) -> None:
        """The work-ahead thread: the pending job whenever no stream is asked for, one at a time."""
        background_priority()
        background_thread()  # its generation does not stop the compiled step's build: both yield to a person
        while True:
            with self._cond:
                while not self._closed and (self._pending is None or self._asked):
                    self._cond.wait()
                if self._closed:
                    return
                job, self._pending = self._pending, None
                self._current = job
            try:
                job.write(self.store)
            except GenerationCancelled:
                pass
            except Exception:  # the page generates what it shows itself, and reports its errors there
                log.exception("work ahead failed")
            finally:
                with self._cond:
                    self._current = None
                    if job.paused and self._pending is None and not self._closed:
                        self._pending = job.again()  # resumed once the stream it yielded to is done
                    job.done.set()
                    self._cond.notify_all()

    def _writer(self, key: Hashable) -> AheadJob | None:
        """The job that writes `key` and will go on: the one in flight, or the next one when nothing pauses it."""
        with self._cond:
            job = self._current
            if job is not None and key in job.keys and not job.cancel.is_set():
                return job
            job = self._pending
            if job is not None and key in job.keys and not self._asked and not self._closed:
                return job
            return None

    def _partial(self, key: Hashable) -> SteeredText | None:
        with self._cond:
            for job in (self._current, self._pending):
                if job is not None and key in job.values:
                    return job.values[key]
        return None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The work ahead yields while inside: the job in flight is cancelled (and waited for, so the model's lock
        is free), then run again once no caller is inside."""
        with self._cond:
            self._asked += 1
            job = self._current
            if job is not None and not job.cancel.is_set():
                job.paused = True
                job.cancel.set()
        try:
            if job is not None and not job.done.wait(YIELD_WAIT_S):
                log.warning("the work ahead did not stop within %.0f s: the stream waits for the model", YIELD_WAIT_S)
            yield
        finally:
            with self._cond:
                self._asked -= 1
                self._cond.notify_all()

    def busy(self) -> bool:
        """Whether work ahead is in flight or waiting to run."""
        with self._cond:
            return self._current is not None or self._pending is not None

    def cancel_ahead(self) -> None:
        """Drop the work ahead (in flight and waiting) and wait until it has stopped."""
        with self._cond:
            self._pending, job = None, self._current
            if job is not None:
                job.paused = False
                job.cancel.set()
        if job is not None:
            job.done.wait(YIELD_WAIT_S)

    # --- the compiled decode step -----------------------------------------------------------------------------
    def warm(self, session: SteeringSession, document: str, gen: GenerationConfig, how: SteerConfig) -> None:
        """Have the warmer thread build the compiled decode step of `document`'s streams (DecodeWarmer.warm)."""
        self.warmer.warm(session, document, gen, how)

    def _wait_idle(self) -> None:
        with self._cond:
            while not self._closed and (self._asked or self._current is not None or self._pending is not None):
                self._cond.wait(0.5)

    def warming(self) -> bool:
        """Whether the warmer thread is building (or about to build) a step."""
        return self.warmer.warming()

    def close(self) -> None:
        """Stop the work ahead and its thread (the warmer finishes the build in flight and ends)."""
        with self._cond:
            self._closed = True
            self._pending, job, worker = None, self._current, self._worker
            self.warmer.close()
            if job is not None:
                job.paused = False
                job.cancel.set()
            self._cond.notify_all()
        if worker is not None and worker is not threading.current_thread():
            worker.join(YIELD_WAIT_S)


class SliderView:
    """One session's slider on one document (Slider.view; the module docstring)."""

    def __init__(
        self,
        engine: Slider,
        name: Hashable,
        session: SteeringSession,
        document: str,
        gen: GenerationConfig,
        how: SteerConfig,
        merged: Hashable,
        reader: Hashable | None,
        moved_on: Callable[[], bool] | None = None,
    ):
        self.engine, self.name, self.session = engine, name, session
        self.document, self.gen, self.how = document, gen, how
        self._merged, self._reader, self._moved_on = merged, reader, moved_on
        self._neutral = round(float(how.neutral), 6)

    def key(self, lam: float) -> tuple:
        """What the text at λ is kept under: the neutral λ's is the merged text, shared by every mode."""
        lam = round(float(lam), 6)
        if lam == self._neutral:
            return ("merged", self._merged, self.gen, self.document)
        return ("steered", self.name, self.gen, self.document, self.how, lam)

    def text(self, lam: float) -> SteeredText | None:
        """The finished text at λ, or None where it is not written yet."""
        return self.engine.store.get(self.key(lam))

    def writing(self, lam: float) -> bool:
        """Whether the text at λ is being written ahead (its stream shows it as it comes)."""
        return self.engine._writer(self.key(lam)) is not None

    def _keep(self, lam: float, g: SteeredText, replace: bool = True) -> None:
        if round(float(lam), 6) == self._neutral:
            g = SteeredText(g.text)  # the merged model's: nothing steered, nothing gated
        self.engine.store.put(self.key(lam), g, replace=replace)

    def stream(self, lam: float) -> Iterator[SteeredText]:
        """The text at λ as it comes (the module docstring)."""
        lam, key, engine = round(float(lam), 6), self.key(lam), self.engine
        done = engine.store.get(key)
        if done is not None:
            yield done
            return
        cancel = engine.readers.start(self._reader, self._moved_on)
        try:
            # written ahead, half or more: its text so far, until it is done; less: written here (the job yields)
            while (job := engine._writer(key)) is not None and job.half_written(key, self.gen.max_new_tokens):
                if cancel.is_set():
                    raise GenerationCancelled()
                yield engine._partial(key) or SteeredText("")
                job.done.wait(POLL_S)
            done = engine.store.get(key)
            if done is not None:
                yield done
                return
            with engine.paused():
                done = engine.store.get(key)  # written while the work ahead stopped
                if done is not None:
                    yield done
                    return
                g = SteeredText("")
                parts = self.session.stream_generations(self.document, lam, self.gen, how=self.how, cancel=cancel)
                with contextlib.closing(parts):
                    for g in parts:
                        yield g
                self._keep(lam, g)
        finally:
            engine.readers.end(self._reader, cancel)

    def merged(self) -> Iterator[SteeredText]:
        """The merged model's text (the neutral λ's) as it comes."""
        return self.stream(self._neutral)

    def ahead(self, lams: Sequence[float]) -> None:
        """Write the positions of `lams` not written yet in the background (the module docstring)."""
        self.engine._ahead(self, lams)

    def every(self, lams: Sequence[float]) -> dict[float, SteeredText]:
        """The text at every λ of `lams`: those not written yet generated now as one batch where the mode batches
        rows (SteeringSession.grid_generations; the work ahead yields meanwhile), and kept (a text already kept
        stays: the one a reader saw)."""
        texts = {lam: self.text(lam) for lam in lams}
        missing = list(dict.fromkeys(round(float(lam), 6) for lam, g in texts.items() if g is None))
        if missing:
            with self.engine.paused():
                made = self.session.grid_generations(self.document, missing, self.gen, how=self.how)
            for lam, g in zip(missing, made, strict=True):
                self._keep(lam, g, replace=False)
            texts = {lam: g or self.text(lam) or made[missing.index(round(float(lam), 6))] for lam, g in texts.items()}
        return texts

    def decode_ready(self) -> bool:
        """Whether this view's new tokens come from the compiled decode step now."""
        return self.session.decode_ready(self.document, self.gen, self.how)


_SHARED: Slider | None = None
_SHARED_LOCK = threading.Lock()


def shared_slider() -> Slider:
    """The process's engine: one work-ahead thread, one warmer and one store for every reader and session."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Slider()
        return _SHARED
