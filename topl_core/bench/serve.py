"""bench --serve: the service as its clients see it. For each concurrency c, c clients of the official `openai`
client stream a steered summary each (the vector mode, a different λ per client) from one running server at once,
against the same c requests sent one after another to the same server; figures are taken where the client waits:

    aggregate_tokens_per_s     generated tokens of all c streams / the wall time from the first request to the last
                               token (concurrent), and the same one after another (sequential)
    concurrent_vs_sequential   the two rates' ratio (the batching's gain)
    ttft_s p50 / p95           time from a request to its first token; last_s: to its last token
    ttft_new_s, ttft_repeat_s  one client's time to the first token of a document the server has not seen, and of the
                               same request sent again (what the server's prompt cache saves; llama-server keeps a
                               slot's prompt too)

The rows start once the server is warm: after a warm-up request, and after the compiled step that request's length
started building is loaded (the workbench's /health; `server_health` in the result: its forwards by kind).
Every request of the rows asks about a document no earlier request asked about (the document with a tag of its own
put before it), so that neither side answers a row's prompts from its prompt cache: the rows measure new documents.

    serve_bench(url, model, document, concurrency=(1, 4, 8), new_tokens=64, api_key="unused") -> dict
    with served(adapter, precision) as url: ...    a `python -m topl_core serve` process on a free loopback port
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, Sequence

import httpx
import openai

from ..data.encode import user_message
from ..foundations.errors import WorkbenchError

LAMBDAS = (0.5, 1.0, 1.5, 2.0, -0.5, -1.0, 0.25, 0.75)  # one per client (normalised units: the slider's span)
READY_S = 900  # a first start computes the adapter's steering vectors (cached after)


def messages(document: str) -> list[dict]:
    """The chat messages whose prompt is the workbench's own summarization prompt of `document`."""
    return [{"role": "user", "content": user_message(document)}]


def _stream(
    client: openai.OpenAI, model: str, document: str, lam: float | None, new_tokens: int
) -> tuple[float, float, int]:
    """(seconds to the first token, to the last, tokens) of one streamed summary, steered at `lam` (None: the server
    steers as it was started, as llama-server does with its control vector; its chunks are counted one token each)."""
    t0 = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages(document),
        max_tokens=new_tokens,
        temperature=0,
        stream=True,
        extra_body={"steering": {"mode": "vector", "lambda": lam}} if lam is not None else None,
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content is not None:
                n = len(choice.logprobs.content)
            else:
                n = int(bool(choice.delta.content))
            if n and first is None:
                first = time.perf_counter() - t0
            tokens += n
    return first or 0.0, time.perf_counter() - t0, tokens


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def serve_bench(
    url: str,
    model: str,
    document: str,
    concurrency: Sequence[int] = (1, 4, 8),
    new_tokens: int = 64,
    api_key: str = "unused",
    log: Callable[[str], None] = print,
    steered: bool = True,
) -> dict:
    """The module docstring's figures against the server at `url` (its /v1 base); `steered` False: the requests carry
    no steering (a server steering as it was started: llama-server with a control vector)."""
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=600)
    _stream(client, model, document, 0.0 if steered else None, 8)  # warm-up: the first forward after loading is slow
    _compiled_ready(url, api_key, log)
    rows = []
    for c in concurrency:
        lams = [LAMBDAS[i % len(LAMBDAS)] if steered else None for i in range(c)]
        log(f"serve bench: {c} client(s) one after another")
        t0 = time.perf_counter()
        sequential = [
            _stream(client, model, _new(document, f"{c} one after another, {i}"), lam, new_tokens)
            for i, lam in enumerate(lams)
        ]
        sequential_s = time.perf_counter() - t0
        log(f"serve bench: {c} client(s) at once")
        results: list[tuple[float, float, int]] = [(0.0, 0.0, 0)] * c
        threads = [
            threading.Thread(
                target=lambda i=i, lam=lam: results.__setitem__(
                    i, _stream(client, model, _new(document, f"{c} at once, {i}"), lam, new_tokens)
                )
            )
            for i, lam in enumerate(lams)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent_s = time.perf_counter() - t0
        tokens, sequential_tokens = sum(r[2] for r in results), sum(r[2] for r in sequential)
        rows.append(
            {
                "clients": c,
                "tokens": tokens,
                "aggregate_tokens_per_s": tokens / concurrent_s,
                "sequential_tokens_per_s": sequential_tokens / sequential_s,
                "concurrent_vs_sequential": (tokens / concurrent_s) / (sequential_tokens / sequential_s),
                "ttft_s_p50": statistics.median(r[0] for r in results),
                "ttft_s_p95": _quantile([r[0] for r in results], 0.95),
                "last_s_p50": statistics.median(r[1] for r in results),
                "last_s_p95": _quantile([r[1] for r in results], 0.95),
                "sequential_ttft_s_p50": statistics.median(r[0] for r in sequential),
                "sequential_last_s_p50": statistics.median(r[1] for r in sequential),
            }
        )
    log("serve bench: one document, then the same request again")
    lam = LAMBDAS[0] if steered else None
    first, again = (_stream(client, model, _new(document, "asked twice"), lam, new_tokens) for _ in range(2))
    steering = "vector, normalised λ, a λ per client" if steered else "the server's own (fixed at its start)"
    return {
        "url": url,
        "model": model,
        "new_tokens": new_tokens,
        "steering": steering,
        "rows": rows,
        "ttft_new_s": first[0],
        "ttft_repeat_s": again[0],
        "server_health": _health(url, api_key),  # the workbench's: its forwards by kind, its compiled steps
    }


def _new(document: str, tag: str) -> str:
    """`document` with a tag of its own before it: a prompt no other request of the bench sends, nor begins as
    another does (llama-server reuses a cached prompt's longest common beginning)."""
    return f"({tag})\n\n{document}"


def _health(url: str, api_key: str) -> dict | None:
    """The workbench's /health (None from a server that has none the same: llama-server answers it otherwise)."""
    try:
        state = httpx.get(url.removesuffix("/v1") + "/health", headers={"Authorization": f"Bearer {api_key}"}).json()
    except (httpx.HTTPError, ValueError):
        return None
    return state if isinstance(state, dict) and "forwards" in state else None


def _compiled_ready(url: str, api_key: str, log: Callable[[str], None]) -> None:
    """Back once no compiled step of the workbench's is building: the warm-up's length started one, and the bench
    measures the server warm."""
    deadline = time.time() + READY_S
    while (state := _health(url, api_key)) and (compiled := state["compiled_steps"]) and compiled["building"]:
        if time.time() > deadline:
            return
        log(f"serve bench: waiting for the compiled step of {compiled['building']} positions")
        time.sleep(5)


def format_serve(res: dict) -> str:
    lines = [
        f"serve bench: {res['model']}, {res['new_tokens']} new tokens a client (steering: {res['steering']})",
        "| clients | tok/s at once | tok/s one after another | ratio | TTFT p50 / p95 s | last p50 / p95 s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['clients']} | {r['aggregate_tokens_per_s']:.1f} | {r['sequential_tokens_per_s']:.1f} | "
            f"{r['concurrent_vs_sequential']:.2f} | {r['ttft_s_p50']:.2f} / {r['ttft_s_p95']:.2f} | "
            f"{r['last_s_p50']:.2f} / {r['last_s_p95']:.2f} |"
        )
    if "ttft_new_s" in res:
        lines.append(
            f"time to the first token, one client: a new document {res['ttft_new_s']:.2f} s, the same request again "
            f"{res['ttft_repeat_s']:.2f} s"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def served(adapter: str, precision: str = "auto", slots: int = 16, log: Callable[[str], None] = print) -> Iterator[str]:
    """A `python -m topl_core serve` process for `adapter` on a free loopback port, ready; yields its /v1 URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "topl_core", "serve", "--run", adapter, "--port", str(port)]
    command += ["--precision", precision, "--slots", str(slots)]
    process = subprocess.Popen(command, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}/v1"
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=5)
        deadline = time.time() + READY_S
        while True:
            if process.poll() is not None:
                raise WorkbenchError(f"the server stopped before it served (exit {process.returncode}); see above.")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.time() > deadline:
                    raise WorkbenchError(f"the server did not answer within {READY_S} s.") from None
                time.sleep(1)
        log(f"serving {adapter} at {url}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
