"""No request stops the service (docs/serve.md, "Errors"): hostile requests — malformed, out of range, unencodable,
too many, abandoned while queued or while decoding, refused for capacity — each get OpenAI's error JSON (or are
cancelled), and after every one the service's invariant holds: when nothing runs, every slot is free and no
generation thread lives; and a plain greedy request still gets the text it got before."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx2 as httpx
import pytest
import torch
from conftest import serving

from topl_core.serve.engine import Request, Sampling, ServeEngine
from topl_core.serve.protocol import MAX_PROMPTS, MIN_TEMPERATURE
from topl_core.serve.row_steering import MERGED

openai = pytest.importorskip("openai", reason="the openai client is installed by requirements.txt")

NEW = 6
SLOTS, WAITING = 4, 4


@pytest.fixture(scope="module")
def served(serve_session):
    with serving(serve_session, slots=SLOTS, waiting=WAITING, max_body=60_000) as both:
        yield both


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url, api_key="unused", max_retries=0)


def messages(text: str = "Summarize: the council met on Tuesday.") -> list[dict]:
    return [{"role": "user", "content": text}]


def greedy(client) -> list[int]:
    reply = client.chat.completions.create(model="tiny", messages=messages(), max_tokens=NEW, temperature=0)
    return [t.token_id for t in reply.choices[0].logprobs.content]


@pytest.fixture(scope="module")
def baseline(client) -> list[int]:
    return greedy(client)


def settled(engine: ServeEngine, within_s: float = 15.0) -> bool:
    """The invariant, waited for: every slot free, no generation alive (a cancelled one stops at its next step)."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        if engine.idle():
            return True
        time.sleep(0.02)
    return engine.idle()


def still_serves(served, client, baseline) -> None:
    engine, _ = served
    assert settled(engine), (engine.live, engine.batcher._free, engine.batcher._joined)
    assert greedy(client) == baseline
    assert settled(engine)


def long_prompt(engine: ServeEngine, tokens: int) -> list[int]:
    return [
        int(t) for t in torch.randint(10, engine.vocabulary - 1, (tokens,), generator=torch.Generator().manual_seed(0))
    ]


M = messages()
CHAT, COMPLETIONS = "/chat/completions", "/completions"
# (path, body, status, the error's param — or its code, as "code:<code>")
HOSTILE = [
    # the request that stopped the service for good: 8 empty prompts × n=2
    (COMPLETIONS, {"model": "tiny", "prompt": [""] * 8, "n": 2, "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": "", "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [[]], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [[1, 2], []], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [-1, 5], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [10**9], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": [1, "a"], "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": {"text": "x"}, "max_tokens": 4}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": ["x"] * (MAX_PROMPTS + 1), "max_tokens": 1}, 400, "prompt"),
    (COMPLETIONS, {"model": "tiny", "prompt": ["x"] * MAX_PROMPTS, "n": 8, "max_tokens": 1}, 400, "n"),
    (COMPLETIONS, {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, {"model": "tiny", "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (COMPLETIONS, {"model": "tiny", "prompt": "\ud800 lone", "max_tokens": 2}, 400, "prompt"),
    (CHAT, {"model": "tiny", "messages": M, "temperature": 1e-300}, 400, "temperature"),
    (CHAT, {"model": "tiny", "messages": M, "temperature": MIN_TEMPERATURE / 2}, 400, "temperature"),
    (CHAT, {"model": "tiny", "messages": M, "temperature": -1}, 400, "temperature"),
    (CHAT, {"model": "tiny", "messages": M, "temperature": 2.5}, 400, "temperature"),
    (CHAT, {"model": "tiny", "messages": M, "top_p": 0}, 400, "top_p"),
    (CHAT, {"model": "tiny", "messages": M, "seed": 2**70}, 400, "seed"),
    (CHAT, {"model": "tiny", "messages": M, "seed": "seven"}, 400, "seed"),
    (CHAT, {"model": "tiny", "messages": M, "stop": ["x" * 1000]}, 400, "stop"),
    (CHAT, {"model": "tiny", "messages": M, "stop": [""]}, 400, "stop"),
    (CHAT, {"model": "tiny", "messages": M, "stop": "\udfff"}, 400, "stop"),
    (CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "\ud800"}]}, 400, "messages[0].content"),
    (
        CHAT,
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        400,
        "messages[0].content",
    ),
    (
        CHAT,
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages[0].content",
    ),
    (
        CHAT,
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages[0].content",
    ),
    (CHAT, {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]}, 400, "messages"),
    (CHAT, {"model": "tiny", "messages": M, "top_logprobs": 21}, 400, "top_logprobs"),
    (CHAT, {"model": "tiny", "messages": M, "max_tokens": 2000}, 400, "max_tokens"),
    (CHAT, {"model": "nope", "messages": M}, 404, "code:model_not_found"),
    (CHAT, {"model": "tiny@teleport:1", "messages": M}, 400, "model"),
    (CHAT, {"model": "tiny@vector:lots", "messages": M}, 400, "model"),
    (CHAT, {"model": "tiny@vector:1e9", "messages": M}, 400, "model"),
    (CHAT, {"model": "tiny@vector:1,colour=red", "messages": M}, 400, "model"),
    (CHAT, {"model": "tiny@vector:1", "messages": M, "steering": {"mode": "vector", "lambda": 1}}, 400, "steering"),
    (CHAT, {"model": "tiny", "messages": M, "n": 0}, 400, "n"),
    (CHAT, {"model": "tiny", "messages": M, "stream": "yes please"}, 400, "stream"),
    (CHAT, [1, 2, 3], 400, None),
]


def post(url: str, body, timeout: float = 60) -> httpx.Response:
    """POST `body`: JSON as json.dumps writes it (a lone surrogate escaped, "\\ud800", as JSON allows), or raw bytes."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=timeout)


def check_error(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]  # OpenAI's error JSON, never FastAPI's {"detail": ...} nor plain text
    assert error["message"] and error["type"], error
    if param is not None and param.startswith("code:"):
        assert error["code"] == param.removeprefix("code:"), error
    elif param is not None:
        assert error["param"] == param or str(error["param"]).startswith(param + "."), error
    return error


@pytest.mark.parametrize("path, body, status, param", HOSTILE, ids=[f"{i}" for i in range(len(HOSTILE))])
def test_a_hostile_request_is_refused_and_the_service_goes_on(served, client, baseline, path, body, status, param):
    check_error(post(served[1].url + path, body), status, param)
    still_serves(served, client, baseline)


def test_bodies_that_are_not_openai_requests(served, client, baseline):
    url = served[1].url
    for raw in (b"\xff\xfe not utf-8", b"{not json", b"[" * 20_000 + b"]" * 20_000, b'{"model": "tiny", "messages": '):
        check_error(post(url + CHAT, raw), 400 if len(raw) < 60_000 else 413, None)
        still_serves(served, client, baseline)
    check_error(post(url + CHAT, b"x" * 70_000), 413, None)  # over max_body
    assert httpx.get(url + CHAT).json()["error"]["message"]  # a GET where a POST goes: 405, OpenAI's JSON
    check_error(httpx.post(url + "/no/such/path", json={}), 404, None)
    still_serves(served, client, baseline)


def test_a_prompt_past_the_context_window_is_refused_before_it_runs(served, client, baseline):
    engine, server = served
    window = engine.context_window
    error = check_error(
        post(server.url + COMPLETIONS, {"model": "tiny", "prompt": long_prompt(engine, window - 2), "max_tokens": 8}),
        400,
        "prompt",
    )
    assert error["code"] == "context_length_exceeded" and str(window) in error["message"]
    still_serves(served, client, baseline)


def test_a_host_header_from_elsewhere_is_refused(served, client, baseline):
    """A keyless loopback server answers only loopback names (a web page reaching it by DNS rebinding sends its own
    domain's)."""
    url = served[1].url
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example"):
        check_error(httpx.get(url + "/models", headers={"host": host}), 403, None)
    for host in ("localhost", f"127.0.0.1:{served[1].port}", "[::1]:1234"):
        assert httpx.get(url + "/models", headers={"host": host}).status_code == 200
    still_serves(served, client, baseline)


def test_a_prompt_that_fails_in_the_batcher_gives_its_slots_back(served, client, baseline):
    """Failures inside the prompt's forward (here: an empty prompt and a token id past the embedding, sent to the
    batcher directly, below the app's checks) raise to their generation and return the slots they took."""
    batcher = served[0].batcher
    for ids in (torch.zeros(1, 0, dtype=torch.long), torch.tensor([[10**7]])):
        for twin in (False, True):
            with pytest.raises(Exception):
                batcher.join(ids, MERGED, twin=twin, score=1 if twin else None).result(30)
            assert batcher.idle()
    still_serves(served, client, baseline)


def test_a_generation_whose_prompt_fails_tells_its_client(served, client, baseline):
    engine = served[0]
    chunks = []
    engine.start([Request(torch.tensor([[10**7]]), MERGED, Sampling(4), chunks.append)])
    assert settled(engine) and chunks[-1].finish_reason == "error" and "IndexError" in chunks[-1].error
    still_serves(served, client, baseline)


def test_a_client_gone_while_queued_leaves_the_queue(served, client, baseline):
    """Every slot busy with long streams; a client that gives up while its request waits for a slot takes its
    generations out of the queue (they never run their prompts), and a 429 starts nothing."""
    engine, server = served
    streams = [
        client.chat.completions.create(model="tiny", messages=M, max_tokens=400, temperature=0, stream=True, n=2)
        for _ in range(SLOTS // 2)
    ]
    for s in streams:
        next(iter(s))
    assert len(engine.batcher._free) == 0
    with pytest.raises(httpx.ReadTimeout):  # queued behind the streams; the client gives up
        httpx.post(server.url + CHAT, json={"model": "tiny", "messages": M, "n": WAITING - 1}, timeout=0.5)
    deadline = time.time() + 10
    while engine.live > SLOTS and time.time() < deadline:
        time.sleep(0.02)
    assert engine.live == SLOTS  # the queued generations are gone, the streams go on
    assert not [j for j in engine.batcher._joins if not j.done.cancelled()]
    body = {"model": "tiny", "messages": M, "n": WAITING + 1}
    r = httpx.post(server.url + CHAT, json=body, timeout=10)
    assert r.status_code == 429 and r.headers["retry-after"]
    assert engine.live == SLOTS  # the refused request started none of its generations
    for s in streams:
        s.close()
    still_serves(served, client, baseline)


def test_a_client_gone_mid_generation_frees_its_slot_at_once(served, client, baseline):
    """A non-streaming client that disconnects while its text decodes: the generation is cancelled (it does not run
    to its 1,000th token), noticed whenever the client goes, not only in a gap between tokens."""
    engine, server = served
    body = json.dumps({"model": "tiny", "prompt": long_prompt(engine, 1000), "max_tokens": 1000}).encode()
    cancelled = engine.ended["cancelled"]
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.time() + 10
        while engine.live == 0 and time.time() < deadline:
            time.sleep(0.005)
        assert engine.live == 1
    assert settled(engine, within_s=5)
    assert engine.ended["cancelled"] == cancelled + 1
    still_serves(served, client, baseline)


def test_hostile_and_plain_clients_at_once(served, client, baseline):
    """Plain clients get their greedy text while others send hostile requests, drop streams and give up waiting."""
    engine, server = served
    texts, failures = [], []

    def plain():
        for _ in range(3):
            texts.append(greedy(client))

    def hostile(k: int):
        try:
            for path, body, status, _ in HOSTILE[k::4]:
                r = post(server.url + path, body)
                if r.status_code not in (status, 429):
                    failures.append((body, r.status_code))
            with httpx.stream("POST", server.url + CHAT, json={"model": "tiny", "messages": M, "stream": True}) as s:
                next(s.iter_lines())
        except Exception as e:  # noqa: BLE001 — a hostile client's own failure is a test failure
            failures.append(repr(e))

    threads = [threading.Thread(target=plain) for _ in range(2)] + [
        threading.Thread(target=hostile, args=(k,)) for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures
    assert texts == [baseline] * 6
    still_serves(served, client, baseline)


def test_no_seed_samples_afresh_and_a_seed_repeats(client):
    kw = dict(model="tiny", messages=M, max_tokens=12, temperature=1.0)

    def ids(**extra) -> list[int]:
        return [t.token_id for t in client.chat.completions.create(**kw, **extra).choices[0].logprobs.content]

    assert ids(seed=3) == ids(seed=3)
    fresh = {tuple(ids()) for _ in range(4)}
    assert len(fresh) > 1  # four unseeded draws of 12 tokens from a random tiny model: not all the same
    two = client.chat.completions.create(**kw, seed=2**64 - 1, n=2)  # the top seed: choice 1 wraps around
    assert len(two.choices) == 2


def test_slots_too_few_for_a_steered_request_are_refused_at_start(serve_session, tmp_path):
    with pytest.raises(ValueError, match="2 slots or more"):
        ServeEngine(serve_session, "fp32", slots=1)
    from topl_core.cli import main

    with pytest.raises(SystemExit, match="--slots"):
        main(["serve", "--run", str(tmp_path), "--slots", "0"])


def test_a_long_prompt_does_not_keep_every_slot_long(served, client, baseline):
    engine, server = served
    r = post(server.url + COMPLETIONS, {"model": "tiny", "prompt": long_prompt(engine, 1500), "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert settled(engine)
    greedy(client)
    assert engine.batcher._mask.shape[1] <= 256  # sized anew for the short prompt once nothing held the long one
    still_serves(served, client, baseline)
