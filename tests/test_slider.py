"""The λ slider's engine (topl_core/analysis/steering/slider.py) without Streamlit, on a tiny Llama adapter trained for
3 steps: a λ written once is drawn at once with the text a fresh stream writes; the work ahead fills the neighbouring
positions on one background thread at the lowest priority, yields to the λ a reader asks for and resumes after; a
reader's new stream cancels the one in flight; the compiled decode step is built on the warmer thread and the work
ahead goes through it once built."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from conftest import NEWS_PAIRS, all_hooks

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.analysis.steering.slider import Slider, TextStore, neighbours
from topl_core.inference.generate import GenerationCancelled, GenerationConfig, load_merged
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.runtime.steered_text import SteeredText

DOC = NEWS_PAIRS[0][1]
GEN = GenerationConfig(max_new_tokens=12, precision="fp32")
LONG = GenerationConfig(max_new_tokens=10_000, precision="fp32")  # a stream still going when the test acts
HOW = SteerConfig(units="raw")  # λ multiplies v itself


@pytest.fixture(scope="module")
def run(steering_run):
    return steering_run


@pytest.fixture(scope="module")
def vectors(run, news_records):
    return build_steering_vectors(run, news_records, top_k=3)


@pytest.fixture(scope="module")
def merged(run):
    return load_merged("tiny-llama", run)


@pytest.fixture
def slider():
    engine = Slider(compiled=False)
    yield engine
    engine.close()


def step_of(vectors) -> float:
    """A λ step that moves the tiny model's residual stream by ~3 per steered site (3-step adapters have tiny B)."""
    return round(3.0 / min(vectors.norms().values()), 2)  # a key's λ as given (the engine rounds to 6 decimals)


def alone(session: SteeringSession, lam: float, gen: GenerationConfig = GEN, how: SteerConfig = HOW) -> SteeredText:
    """What a fresh stream of λ ends on: SteeringSession.stream_generations' last value."""
    *_, last = session.stream_generations(DOC, lam, gen, how=how)
    return last


def idle(engine: Slider, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while engine.busy():
        assert time.monotonic() < deadline, "the work ahead did not finish"
        time.sleep(0.02)


def ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "topl-slider-ahead"]


def test_the_store_keeps_the_latest_and_drops_the_least_recently_used():
    store = TextStore(size=2)
    store.put("a", SteeredText("1"))
    store.put("b", SteeredText("2"))
    store.put("a", SteeredText("3"), replace=False)  # a text already kept stays
    assert store.get("a").text == "1"  # and "a" is now the most recently used
    store.put("c", SteeredText("4"))
    assert store.get("b") is None and store.get("a").text == "1" and len(store) == 2
    assert neighbours([-1.0, 0.0, 1.0, 2.0], 0.1) == [-1.0, 1.0] and neighbours([0.0, 1.0], -5) == [1.0]


def test_a_cached_lambda_is_drawn_at_once_with_the_fresh_streams_text(merged, vectors, slider):
    """A λ streams token by token the first time (its last value: a fresh stream's), then comes back at once, as one
    value; the neutral λ is the merged text, written once per document and shared by every mode."""
    session, hooks = SteeringSession(merged, vectors), all_hooks(merged.model)
    view, lam = slider.view("s", session, DOC, GEN, HOW), step_of(vectors)
    parts = list(view.stream(lam))
    assert len(parts) > 1 and parts[-1] == alone(session, lam) and view.text(lam) == parts[-1]
    assert list(view.stream(lam)) == [parts[-1]]
    merged_text = list(view.merged())[-1]
    assert merged_text.text == alone(session, 0.0).text and list(view.stream(0.0)) == [merged_text]
    other = slider.view("s", session, DOC, GEN, SteerConfig("conditional"))  # another mode, the same merged text
    assert list(other.merged()) == [merged_text] and other.text(1.0) == merged_text
    assert all_hooks(merged.model) == hooks and session._lock.acquire(blocking=False)
    session._lock.release()


def test_work_ahead_fills_the_neighbours_on_one_thread(merged, vectors, slider):
    """view.ahead writes the positions next to λ in the background, as one batch, each the text it gives alone; a
    move onto one then reads it at once. However often it is asked, one thread writes ahead, at the lowest priority."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    view = slider.view("s", session, DOC, GEN, HOW)
    grid = [k * step for k in range(-2, 3)]
    before = set(ahead_threads())
    view.ahead(neighbours(grid, 0.0))
    idle(slider)
    assert [view.text(lam) for lam in (-step, step)] == [alone(session, lam) for lam in (-step, step)]
    assert list(view.stream(step)) == [view.text(step)]  # read, not generated
    for at in grid:  # moves across the grid, each asking for its neighbours: the last asked for is written
        view.ahead(neighbours(grid, at))
        assert len(set(ahead_threads()) - before) <= 1
    idle(slider)
    written = {lam: view.text(lam) for lam in grid if view.text(lam) is not None}
    assert 2 * step in written and written == {lam: alone(session, lam) for lam in written}
    (worker,) = set(ahead_threads()) - before
    assert worker is slider._worker and worker.is_alive()


def test_a_gated_mode_is_written_ahead_lambda_by_lambda(merged, vectors, slider, monkeypatch):
    """A mode that does not batch rows (the gated one: the adapter's head judges every token) is written ahead one λ
    after another, each kept as soon as it is done, with the text and the replacements it gives alone."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    how = SteerConfig("gated", units="raw")
    monkeypatch.setattr(session, "stream_grid", None)  # never the grid
    view = slider.view("s", session, DOC, GEN, how)
    view.ahead([-step, step])
    idle(slider)
    assert [view.text(lam) for lam in (-step, step)] == [alone(session, lam, how=how) for lam in (-step, step)]
    assert view.text(step).gate is not None


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread CPU priority on this platform")
def test_work_ahead_runs_at_the_lowest_cpu_priority(merged, vectors, slider, monkeypatch):
    """The work-ahead thread, and the threads it starts (torch's workers), run at nice 19, so what a reader waits
    for gets the cores first; the calling thread keeps its own priority."""
    session = SteeringSession(merged, vectors)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = []

    def stream_grid(document, lambdas, gen, how, cancel):
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        worker = threading.Thread(
            target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        )
        worker.start()
        worker.join()
        seen.insert(0, mine)
        yield [SteeredText("a"), SteeredText("b")]

    monkeypatch.setattr(session, "stream_grid", stream_grid)
    view = slider.view("s", session, DOC, GEN, HOW)
    view.ahead([1.0, 2.0])
    idle(slider)
    assert seen == [19, 19] and view.text(2.0).text == "b"
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller


def test_work_ahead_runs_its_torch_work_on_one_core_and_leaves_the_callers(merged, vectors, slider, monkeypatch):
    """The work-ahead thread's parallel torch work runs on that thread alone (hardware/threads.py: a second thread's
    OpenMP team made every later stream of a reader slower), and the reader's threads keep every core."""
    session, caller = SteeringSession(merged, vectors), torch.get_num_threads()
    seen = []

    def in_a_new_thread() -> int:
        got = []
        fresh = threading.Thread(target=lambda: got.append(torch.get_num_threads()))
        fresh.start()
        fresh.join()
        return got[0]

    before = in_a_new_thread()

    def stream_grid(document, lambdas, gen, how, cancel):
        seen.append(torch.get_num_threads())
        yield [SteeredText("a"), SteeredText("b")]

    monkeypatch.setattr(session, "stream_grid", stream_grid)
    slider.view("s", session, DOC, GEN, HOW).ahead([1.0, 2.0])
    idle(slider)
    assert seen == [1] and torch.get_num_threads() == caller and in_a_new_thread() == before


def test_a_lambda_half_written_ahead_shows_its_text_so_far_then_the_whole(merged, vectors, slider, monkeypatch):
    """A move onto a λ the work ahead has written half of waits for the rest, showing its text so far, instead of
    generating it again; the text it ends on is the one the λ gives alone."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    half, go, real, own = threading.Event(), threading.Event(), session.stream_grid, []
    expected = {lam: alone(session, lam) for lam in (step, -step)}  # before the job holds the model

    def held(*args, **kw):  # the job stops half-way until the reader is waiting on it
        for n, texts in enumerate(real(*args, **kw), 1):
            yield texts
            if n == GEN.max_new_tokens // 2:
                half.set()
                go.wait(60)

    monkeypatch.setattr(session, "stream_grid", held)
    real_stream = session.stream_generations
    monkeypatch.setattr(session, "stream_generations", lambda *a, **k: own.append(1) or real_stream(*a, **k))
    view = slider.view("s", session, DOC, GEN, HOW)
    view.ahead([-step, step])
    assert half.wait(60) and view.writing(step) and view.writing(-step) and not view.writing(2 * step)
    parts = view.stream(step)
    so_far = next(parts)
    assert so_far.text and expected[step].text.startswith(so_far.text)  # the half written
    go.set()
    rest = list(parts)
    assert rest[-1] == expected[step] and not own  # the reader generated nothing itself
    idle(slider)
    assert view.text(-step) == expected[-step]


def test_a_lambda_barely_begun_ahead_is_written_by_the_reader_at_full_speed(merged, vectors, slider, monkeypatch):
    """A move onto a λ the work ahead (one core, lowest priority) has barely begun: the reader writes it itself, the
    job yields (nothing of it kept) and resumes after, writing the other position."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    go, real, own = threading.Event(), session.stream_grid, []

    def held(*args, cancel=None, **kw):  # the job has written nothing until `go`, and stops when cancelled
        while not go.is_set():
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled()
            time.sleep(0.01)
        yield from real(*args, cancel=cancel, **kw)

    monkeypatch.setattr(session, "stream_grid", held)
    real_stream = session.stream_generations
    monkeypatch.setattr(session, "stream_generations", lambda *a, **k: own.append(a[1]) or real_stream(*a, **k))
    view = slider.view("s", session, DOC, GEN, HOW)
    view.ahead([-step, step])
    assert view.writing(step)
    g = list(view.stream(step))[-1]
    assert own == [step] and view.text(step) == g  # written here, kept
    go.set()
    idle(slider)
    assert g == alone(session, step) and view.text(-step) == alone(session, -step)


def test_an_asked_lambda_pauses_the_work_ahead_which_resumes_after(merged, vectors, slider):
    """A λ nobody wrote ahead: the job in flight stops at its next decoder layer (its text not kept), the asked λ
    streams with a fresh stream's text, and the job runs again once the stream is done."""
    session, step, hooks = SteeringSession(merged, vectors), step_of(vectors), all_hooks(merged.model)
    far = slider.view("far", session, DOC, LONG, HOW)
    far.ahead([-step, step])
    deadline = time.monotonic() + 60
    while slider._current is None or not slider._current.values:  # under way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first = slider._current
    view = slider.view("s", session, DOC, GEN, HOW)
    parts = view.stream(2 * step)
    g = next(parts)
    assert first.done.is_set() and first.paused and slider._current is None  # paused while the asked λ streams
    *_, g = [g, *parts]
    assert g == alone(session, 2 * step) and view.text(2 * step) == g
    deadline = time.monotonic() + 60
    while slider._current is None or slider._current.keys != first.keys:  # resumed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert far.text(step) is None and far.writing(step)
    slider.cancel_ahead()
    assert not slider.busy() and far.text(step) is None and all_hooks(merged.model) == hooks


def test_work_ahead_for_other_positions_drops_the_job_in_flight(merged, vectors, slider):
    """A job for other positions replaces the one in flight, which stops within a layer and keeps nothing;
    cancel_ahead drops the rest, leaving no hook behind and the model's lock free."""
    session, step, hooks = SteeringSession(merged, vectors), step_of(vectors), all_hooks(merged.model)
    view = slider.view("s", session, DOC, LONG, HOW)
    view.ahead([step])
    deadline = time.monotonic() + 60
    while slider._partial(view.key(step)) is None:  # under way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    view.ahead([-step])
    assert not view.writing(step) and view.writing(-step)
    slider.cancel_ahead()
    assert not slider.busy() and view.text(step) is None and view.text(-step) is None
    assert all_hooks(merged.model) == hooks and session._lock.acquire(blocking=False)
    session._lock.release()


def test_a_readers_new_stream_cancels_the_one_in_flight(merged, vectors, slider):
    """Moving λ: the reader's stream in flight stops (GenerationCancelled at its next decoder layer, its text not
    kept), and the new λ gets a fresh stream's text; the hooks are gone and the model's lock is free afterwards."""
    session, step, hooks = SteeringSession(merged, vectors), step_of(vectors), all_hooks(merged.model)
    before = slider.view("s", session, DOC, LONG, HOW, reader="reader")
    started, outcome = threading.Event(), []

    def read() -> None:
        try:
            for _ in before.stream(step):
                started.set()
            outcome.append("ended")
        except GenerationCancelled:
            outcome.append("cancelled")

    reading = threading.Thread(target=read)
    reading.start()
    assert started.wait(60)
    after = slider.view("s", session, DOC, GEN, HOW, reader="reader")
    g = list(after.stream(-step))[-1]
    reading.join(60)
    assert outcome == ["cancelled"] and before.text(step) is None
    assert g == alone(session, -step) and after.text(-step) == g
    other = slider.view("s", session, DOC, GEN, HOW, reader="someone else")
    assert list(other.stream(-step)) == [g]
    assert all_hooks(merged.model) == hooks and session._lock.acquire(blocking=False)
    session._lock.release()


def test_a_reader_that_moved_on_stops_its_stream_inside_the_prompt(merged, vectors, slider):
    """`moved_on` (a page's next run asked for) is read at every decoder layer: the stream stops inside its prompt's
    forward, before its first token, with nothing kept, and the model's lock is free for the next one."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    layers = []

    def moved_on() -> bool:
        layers.append(1)
        return len(layers) > 2  # asked while the prompt's forward is on its first layers

    view = slider.view("s", session, DOC, GEN, HOW, reader="reader", moved_on=moved_on)
    with pytest.raises(GenerationCancelled):
        list(view.stream(step))
    assert view.text(step) is None and 2 < len(layers) < merged.model.config.num_hidden_layers + 3
    assert session._lock.acquire(blocking=False)
    session._lock.release()
    assert list(slider.view("s", session, DOC, GEN, HOW, reader="reader").stream(step))[-1] == alone(session, step)


def test_every_position_as_one_batch_keeps_the_texts_already_shown(merged, vectors, slider):
    """view.every: the positions not written yet generated as one batch, each a text its λ gives alone (fp32); a
    text already shown stays."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    view = slider.view("s", session, DOC, GEN, HOW)
    shown = list(view.stream(step))[-1]
    grid = [k * step for k in range(-2, 3)]
    texts = view.every(grid)
    assert list(texts) == grid and texts[step] is shown
    assert [texts[lam].text for lam in grid] == session.generate_grid(DOC, grid, GEN, how=HOW)
    assert view.every(grid) == texts


def test_the_base_models_text_once_per_document(merged, slider):
    """slider.base streams the base model's text the first time, then draws it at once."""
    from topl_core.inference.generate import generate

    parts = list(slider.base("tiny", merged, DOC, GEN))
    assert parts[-1].text == generate(merged, [DOC], GEN)[0] and len(parts) > 1
    assert list(slider.base("tiny", merged, DOC, GEN)) == [parts[-1]]


def test_the_compiled_step_is_built_on_the_warmer_and_the_work_ahead_takes_it(merged, vectors):
    """Slider(compiled=True): a view asks the warmer thread to build the compiled decode step (on a CPU the exported
    package, by a child process) at once; nothing waits for it. Once built, the work ahead writes λ by λ through it,
    with the eager text, and the streams of the view take it."""
    session, step = SteeringSession(merged, vectors), step_of(vectors)
    gen, how = GEN, SteerConfig("vector", "generated", "raw")
    eager = {lam: alone(SteeringSession(merged, vectors), lam, gen, how) for lam in (-step, step)}
    engine = Slider(compiled=True)
    try:
        view = engine.view("s", session, DOC, gen, how)
        for thread in [t for t in threading.enumerate() if t.name == "topl-decode-warmer"]:
            thread.join(300)
        assert view.decode_ready() and session.decoder is not None
        steps, real = [], session.decoder._step
        session.decoder._step = lambda *a: steps.append(1) or real(*a)
        view.ahead([-step, step])
        idle(engine)
        assert {lam: view.text(lam) for lam in eager} == eager and steps
    finally:
        engine.close()
