"""The service's compiled batched step (inference/batch_step.py): once its package is built, a float32 service decodes
every step through it, and a bf16 one through its step over bf16 weights, and what clients read is what the eager
forward gives — the same tokens as the Steering page's stream, the same log-probabilities and p(good) (within each
precision's rounding) — for rows of different λ in one batch, a merged row beside them, and
a gated row whose judge turns its steering off and on; up to the largest row bucket at once (2 rows in float32, 4 in
bf16 with the 4 slots served here). The head is read at
layer 1 of tiny-llama's 4: a step of a steered row and its twin runs the package whose second row stops there."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from conftest import NEWS_PAIRS, serving

from topl_core.data.encode import user_message
from topl_core.hardware.precision import TORCH_DTYPES
from topl_core.inference.generate import GenerationConfig
from topl_core.models.forward import Head
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.serve.batch import ROOM

openai = pytest.importorskip("openai")

NEW = 12
DOCS = [NEWS_PAIRS[i][1] for i in range(3)]
HOW = SteerConfig("vector", positions="generated", units="raw")
# how far the compiled step's log-probabilities and p(good) may read from the eager step's: float32 rounds alike but
# for the order of its sums; bf16 rounds each linear's output to bf16 after sums of another order (measured on
# tiny-llama: within 3.5e-3 and 4e-4)
TOLERANCES = {"fp32": (1e-4, 1e-5), "bf16": (1e-2, 2e-3)}


def ask(client, doc: str, steering: dict | None):
    extra = {"steering": steering} if steering else {}
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": user_message(doc)}],
        max_tokens=NEW,
        temperature=0,
        logprobs=True,
        extra_body=extra,
    )
    tokens = reply.choices[0].logprobs.content
    return reply.choices[0].message.content.strip(), [t.logprob for t in tokens], [t.p_good for t in tokens]


@pytest.fixture(scope="module")
def session(serve_session):
    """serve_session with its head read at layer 1 of 4; both tests serve it, so the second loads the packages the
    first built (the same model, sites, head layer and shapes)."""
    return SteeringSession(serve_session.lm, serve_session.vectors, head=Head(1, serve_session.head().linear))


def served(session, monkeypatch, compiled: bool, groups: list[list[tuple[str, dict | None]]], precision="fp32"):
    """The replies to each group of requests, a group asked all at once, and the batcher's forwards by kind."""
    monkeypatch.setenv("TOPL_COMPILED_DECODE", "auto" if compiled else "0")
    slots = 4 if precision == "bf16" else 8  # float32's 8 the bench's test below (its packages, built once)
    with serving(session, precision, slots=slots) as (engine, server):
        if compiled:
            assert engine.batcher.compiled.dtype == TORCH_DTYPES[precision]  # bf16: the step over bf16 weights
            assert engine.batcher.warm(ROOM, wait=True), engine.batcher.compiled.failed  # every prompt here fits
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        replies = []
        for group in groups:
            with concurrent.futures.ThreadPoolExecutor(len(group)) as pool:
                replies += pool.map(lambda r: ask(client, *r), group)
        health = httpx.get(server.url.removesuffix("/v1") + "/health").json()
        ready = [list(shape) for shape in engine.batcher.compiled.shapes(ROOM)] if compiled else None
        assert health["compiled_steps"] == ({"ready": ready, "building": [], "failed": []} if compiled else None)
        return replies, health["forwards"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_compiled_step_serves_what_the_eager_forward_serves(session, monkeypatch, precision):
    lam = 3.0 / min(session.vectors.norms().values())  # moves a 3-step adapter's residual stream visibly
    steering = {"mode": HOW.mode, "units": HOW.units, "positions": HOW.positions}
    groups = [  # at most 2 rows at once, float32's largest bucket: a steered request decodes with its twin
        [(DOCS[0], {**steering, "lambda": lam})],
        [(DOCS[1], {**steering, "lambda": -lam})],
        [(DOCS[2], None), (DOCS[1], None)],  # merged: no twin, each its own row read, two requests in one step
        [(DOCS[0], {"mode": "gated", "lambda": lam, "units": "raw", "tau": 0.5})],
    ]
    if precision == "bf16":  # its bucket of 4 rows (4 slots here: the packages of 8 rows are not built)
        groups.append([(DOCS[1], {**steering, "lambda": lam}), (DOCS[2], None)])
    compiled, forwards = served(session, monkeypatch, True, groups, precision)
    assert set(forwards) == {"compiled"}, forwards  # every step: a package
    eager, forwards = served(session, monkeypatch, False, groups, precision)
    assert set(forwards) == {"eager"}, forwards
    gen = GenerationConfig.chosen(precision, max_new_tokens=NEW)
    page = list(session.stream_steered(DOCS[0], lam, gen, how=HOW))[-1]
    assert compiled[0][0] == page
    logprob_tol, p_good_tol = TOLERANCES[precision]
    for (text, logprob, p_good), (text_e, logprob_e, p_good_e) in zip(compiled, eager):
        assert text == text_e
        assert logprob == pytest.approx(logprob_e, abs=logprob_tol)
        assert p_good == pytest.approx(p_good_e, abs=p_good_tol)
    assert compiled[1][0] != compiled[3][0]  # −λ acts: the same document merged reads otherwise


def test_bench_serve_measures_the_server_warm(session, monkeypatch):
    """bench --serve waits for the compiled step its warm-up request started, so that its rows are the compiled
    step's (the server's /health after the bench: no eager step past the warm-up's)."""
    from topl_core.bench.serve import serve_bench

    monkeypatch.setenv("TOPL_COMPILED_DECODE", "auto")
    with serving(session, "fp32", slots=8) as (engine, server):
        res = serve_bench(server.url, "tiny", DOCS[0], concurrency=(1,), new_tokens=6, log=lambda _: None)
        shapes = [list(shape) for shape in engine.batcher.compiled.shapes(ROOM)]
    health = res["server_health"]
    assert health["compiled_steps"]["building"] == [] and health["compiled_steps"]["ready"] == shapes
    warm_up = 8 + 1  # its steps (8 tokens, and the last one's p(good)): eager at most, while the step builds
    assert health["forwards"].get("eager", 0) <= warm_up < health["forwards"]["compiled"]
    assert [r["clients"] for r in res["rows"]] == [1] and res["rows"][0]["tokens"] > 0
