"""The HTTP service: OpenAI's /v1/models, /v1/completions and /v1/chat/completions (protocol.py) over a ServeEngine,
as a FastAPI app; streams as server-sent events, as OpenAI sends them, ending with `data: [DONE]`.

    app = create_app(engine, name="topl-smollm2", api_key=None, max_body=1_000_000)
    uvicorn.run(app, host="127.0.0.1", port=8000)       (cli/serve.py)

Every choice is one Generation of the engine; every input is checked before any generation starts, and a client's
generations start all together or not at all (429). A client that disconnects — streaming or not, decoding or still
waiting for a slot — cancels its generations (they stop at their next step, or leave the queue, and free their slots).
A body larger than `max_body` gets 413 before it is read whole; with `api_key`, every request must carry it as a Bearer
token (compared in constant time); a Host header outside `allowed_hosts` gets 403 (a web page reaching a loopback
server through DNS rebinding). Whatever fails, the answer is OpenAI's error JSON and the service goes on.

lm-eval's remote tokenizer reads /tokenizer_info, /tokenize and /detokenize (at the root, as vLLM serves them);
/health says what the engine holds (ServeEngine.health: its forwards by kind, its compiled steps).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import AsyncIterator, Callable, Iterable

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException

from ..runtime.modes import SteerConfig
from . import tokenizer_api
from .engine import Busy, Chunk, Sampling, ServeEngine
from .engine import Request as GenerationRequest
from .guard import LOOPBACK_HOSTS, Guard
from .protocol import (
    ALIAS_MARK,
    SEED_RANGE,
    ChatRequest,
    CommonFields,
    CompletionRequest,
    ServeError,
    TokenIds,
    alias_steering,
)
from .replies import Choice, Reply, absorb, sse
from .row_steering import Steering
from .tokenizer_api import DetokenizeRequest, TokenizeRequest, check_ids

DEFAULT_NEW_TOKENS = 64
RETRY_AFTER_S = 1


def create_app(
    engine: ServeEngine | None,
    name: str,
    api_key: str | None = None,
    max_body: int = 1_000_000,
    max_prompt_tokens: int = 4096,
    exposed: Iterable[str] = (),
    allowed_hosts: Iterable[str] | None = LOOPBACK_HOSTS,
) -> FastAPI:
    """The service (the module docstring) over `engine`, its models named after `name` (the adapter), with the
    steering aliases `exposed` (protocol.alias_name) listed beside them. `allowed_hosts` None: any Host header (a
    server beyond loopback, behind its API key). `engine` None: the process that serves the app gives it later,
    serve_engine(app.state.engine_key, engine) (a Ray Serve replica builds its own: ray_serve.py)."""
    app = FastAPI(title="TOPL Workbench", docs_url=None, redoc_url=None)
    models = {name: "steered", f"{name}:merged": "merged", f"{name}:base": "base"}
    for alias in exposed:
        alias_steering(alias).config("model")  # a misspelt alias fails at start, not at its first request
        models[alias] = "alias"
    created = int(time.time())
    key = app.state.engine_key = uuid.uuid4().hex
    if engine is not None:
        serve_engine(key, engine)

    app.add_middleware(Guard, api_key=api_key, max_body=max_body, allowed_hosts=allowed_hosts)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        detail = first.get("msg", "invalid").removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            detail = "unknown field (see the OpenAI API's fields and the service's `steering`)"
        elif first.get("type") == "json_invalid":
            param, detail = None, f"not valid JSON ({first.get('ctx', {}).get('error', detail)})"
        return ServeError(400, f"{param or 'body'}: {detail}.", param).response()

    @app.exception_handler(ServeError)
    async def refused(_request: Request, exc: ServeError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_refused(_request: Request, exc: HTTPException):
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return ServeError(exc.status_code, f"{exc.detail}.", None, kind, code).response()

    @app.exception_handler(Exception)
    async def failed(_request: Request, exc: Exception):
        if isinstance(exc, RecursionError):  # JSON nested past the parser's depth
            return ServeError(400, "body: JSON nested too deeply to read.", None).response()
        return ServeError(500, f"the service failed: {type(exc).__name__}: {exc}", None, "server_error").response()

    @app.get("/v1/models")
    async def list_models():
        data = [{"id": m, "object": "model", "created": created, "owned_by": "topl-workbench"} for m in models]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        messages = [m.plain(f"messages[{k}]") for k, m in enumerate(body.messages)]
        tok = _engine(key).tokenizer
        try:
            prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # no template, or one that refuses these roles (e.g. no system role)
            raise ServeError(400, f"messages: the model's chat template refuses them ({e}).", "messages") from None
        return await _complete(request, body, [_prompt_ids(_engine(key), prompt)], chat=True)

    @app.post("/v1/completions")
    async def complete(body: CompletionRequest, request: Request):
        return await _complete(request, body, [_prompt_ids(_engine(key), p) for p in body.prompts()], chat=False)

    @app.get("/health")
    async def health():
        return _engine(key).health()

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return tokenizer_api.tokenizer_info(_engine(key))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        engine = _engine(key)
        ids = tokenizer_api.tokenize(engine, body)
        return {"count": len(ids), "max_model_len": engine.context_window, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        engine = _engine(key)
        check_ids(engine, body.tokens, "tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    def steering_of(body: CommonFields) -> Steering:
        kind = models.get(body.model)
        if kind is None and body.model.startswith(name + ALIAS_MARK):
            kind = "alias"
        if kind is None:
            raise ServeError(
                404,
                f"model {body.model!r}: this service serves {list(models)}.",
                "model",
                "invalid_request_error",
                "model_not_found",
            )
        if kind == "base":  # the merged model with the adapter's update scaled to 0
            if body.steering is not None:
                raise ServeError(
                    400, "steering: the base model is not steered; ask for model " + repr(name), "steering"
                )
            return Steering(SteerConfig("conditional"), 0.0)
        if kind in ("merged", "alias") and body.steering is not None:
            raise ServeError(
                400,
                f"steering: {body.model!r} names its own steering; to steer per request, ask for {name!r}.",
                "steering",
            )
        if kind == "alias":
            how, lam = alias_steering(body.model).config("model")
        elif body.steering is None:
            return Steering(SteerConfig(), 0.0)
        else:
            how, lam = body.steering.config()
        if how.spec.needs_head and not _engine(key).has_head:
            raise ServeError(400, f"mode {how.mode!r} reads the adapter's head, which it has none of.", "steering")
        return Steering(how, lam)

    async def _complete(request: Request, body: CommonFields, encoded: list[torch.Tensor], chat: bool):
        """Every check first (nothing has started), then the generations all at once, then their answer."""
        body.check_penalties()
        steering = steering_of(body)
        engine = _engine(key)
        echo = isinstance(body, CompletionRequest) and body.echo
        new = body.new_tokens(DEFAULT_NEW_TOKENS)
        if new == 0 and not echo:
            raise ServeError(
                400, "max_tokens: 0 generates nothing; with echo it scores the prompt alone.", "max_tokens"
            )
        sampling = Sampling(new, body.temperature, body.top_p, body.seed, body.stops(), body.top_logprobs_asked(), echo)
        where = "messages" if chat else "prompt"
        for ids in encoded:
            _check_length(engine, ids.shape[1], new, max_prompt_tokens, where)
        if len(encoded) * body.n > engine.capacity:
            raise ServeError(
                400,
                f"{len(encoded)} prompt(s) × n={body.n} asks for {len(encoded) * body.n} generations; this service "
                f"runs at most {engine.capacity} at once (serve --slots and --queue).",
                "n",
            )
        loop = asyncio.get_running_loop()
        choices = [Choice(k) for k in range(len(encoded) * body.n)]
        requests = [
            GenerationRequest(ids, steering, _seeded(sampling, i), _threadsafe(loop, choices[p * body.n + i].queue))
            for p, ids in enumerate(encoded)
            for i in range(body.n)
        ]
        try:
            generations = engine.start(requests)
        except Busy:
            return ServeError(429, "every slot is busy; retry shortly.", None, "rate_limit").response(RETRY_AFTER_S)
        prompt_tokens = sum(ids.shape[1] for ids in encoded) * body.n
        reply = Reply(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", body.model, chat, steering)
        if echo:
            for choice, ids in zip(choices, (ids for ids in encoded for _ in range(body.n))):
                choice.echo_text = engine.tokenizer.decode(ids[0])
        if body.stream:
            return StreamingResponse(
                _stream(request, reply, choices, generations, prompt_tokens, body), media_type="text/event-stream"
            )
        try:
            if not await _collect(request, choices):
                return ServeError(499, "the client closed the request.", None).response()
        finally:
            for g in generations:
                g.cancel()
        return reply.whole(choices, prompt_tokens)

    return app


def _prompt_ids(engine: ServeEngine, prompt: str | TokenIds) -> torch.Tensor:
    """A completions prompt as token ids (1 × positions): a string tokenized as it stands (no special tokens added:
    the client's text is the whole prompt), token ids checked against the vocabulary."""
    if isinstance(prompt, str):
        ids = engine.tokenizer(prompt, add_special_tokens=False).input_ids
        if not ids:
            raise ServeError(400, "prompt: it tokenizes to no token at all.", "prompt")
        return torch.tensor([ids])
    check_ids(engine, prompt, "prompt")
    return torch.tensor([prompt])


def _check_length(engine: ServeEngine, prompt: int, new: int, max_prompt_tokens: int, param: str) -> None:
    if prompt > max_prompt_tokens:
        raise ServeError(
            400,
            f"the prompt is {prompt} tokens; this service takes {max_prompt_tokens}.",
            param,
            code="context_length_exceeded",
        )
    window = engine.context_window
    if window is not None and prompt + new > window:
        raise ServeError(
            400,
            f"the prompt's {prompt} tokens and max_tokens={new} exceed the model's context window of {window} tokens; "
            "shorten the prompt or ask for fewer tokens.",
            param,
            code="context_length_exceeded",
        )


def _seeded(sampling: Sampling, i: int) -> Sampling:
    """Choice i's sampling: the request's seed + i (within what a generator takes), or None (fresh randomness) when
    the request gave none."""
    if sampling.seed is None:
        return sampling
    lo, hi = SEED_RANGE
    return Sampling(**{**sampling.__dict__, "seed": (sampling.seed + i - lo) % (hi - lo + 1) + lo})


_ENGINES: dict[str, ServeEngine] = {}  # the engine each app of this process serves, by its engine_key


def serve_engine(key: str, engine: ServeEngine) -> None:
    """The engine the app whose state.engine_key is `key` serves, in this process."""
    _ENGINES[key] = engine


def _engine(key: str) -> ServeEngine:
    engine = _ENGINES.get(key)
    if engine is None:
        raise ServeError(503, "the model is still loading; retry shortly.", None, "server_error")
    return engine


def _threadsafe(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[Chunk], None]:
    def put(chunk: Chunk) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, chunk)

    return put


async def _collect(request: Request, choices: list[Choice]) -> bool:
    """Every choice to its end (True), or False as soon as the client goes away (its generations are then
    cancelled by the caller)."""

    async def every_choice() -> None:
        for choice in choices:
            while choice.finish_reason is None:
                piece = await choice.queue.get()
                absorb(choice, piece)
                if piece.error:
                    raise ServeError(500, f"the generation failed: {piece.error}", None, "server_error")

    collecting = asyncio.ensure_future(every_choice())
    watching = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        if collecting.done():
            collecting.result()  # raises what the generation raised
            return True
        return False
    finally:
        for task in (collecting, watching):
            task.cancel()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(
    request, reply: Reply, choices, generations, prompt_tokens: int, body: CommonFields
) -> AsyncIterator[str]:
    """The choices' chunks as server-sent events, as they come, then the usage (if asked) and [DONE]."""
    pending = {asyncio.ensure_future(c.queue.get()): c for c in choices}
    first = {c.index: True for c in choices}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            if not done and await request.is_disconnected():
                return
            for task in done:
                choice = pending.pop(task)
                piece = task.result()
                absorb(choice, piece)
                if piece.error:
                    yield sse(ServeError(500, f"the generation failed: {piece.error}", None, "server_error").body())
                    continue
                yield sse(reply.chunk(choice, piece, first[choice.index]))
                first[choice.index] = False
                if piece.finish_reason is None:
                    pending[asyncio.ensure_future(choice.queue.get())] = choice
        if (body.stream_options or {}).get("include_usage"):
            completion = sum(c.completion_tokens for c in choices)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
            yield sse(
                {
                    "id": reply.id,
                    "object": reply.object + (".chunk" if reply.chat else ""),
                    "created": reply.created,
                    "model": reply.model,
                    "choices": [],
                    "usage": usage,
                }
            )
        yield "data: [DONE]\n\n"
    finally:
        for task in pending:
            task.cancel()
        for g in generations:
            g.cancel()
