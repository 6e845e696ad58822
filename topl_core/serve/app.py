"""The HTTP service: OpenAI's /v1/models, /v1/completions and /v1/chat/completions (protocol.py) over a ServeEngine,
as a FastAPI app; streams as server-sent events, as OpenAI sends them, ending with `data: [DONE]`.

    app = create_app(engine, name="topl-smollm2", api_key=None, max_body=1_000_000)
    uvicorn.run(app, host="127.0.0.1", port=8000)       (cli/serve.py)

Every choice is one Generation of the engine; a client that disconnects cancels its generations (they stop at their
next step and free their slots). A body larger than `max_body` gets 413 before it is read whole; with `api_key`, every
request must carry it as a Bearer token (compared in constant time).
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from ..analysis.steering.modes import SteerConfig
from .batch import Steering
from .engine import Busy, Chunk, Sampling, ServeEngine
from .protocol import ChatRequest, CommonFields, CompletionRequest, ServeError
from .replies import Choice, Reply, absorb, sse

DEFAULT_NEW_TOKENS = 64
RETRY_AFTER_S = 1


def create_app(
    engine: ServeEngine | None,
    name: str,
    api_key: str | None = None,
    max_body: int = 1_000_000,
    max_prompt_tokens: int = 4096,
) -> FastAPI:
    """The service (the module docstring) over `engine`, its models named after `name` (the adapter). `engine` None:
    the process that serves the app gives it later, serve_engine(app.state.engine_key, engine) (a Ray Serve replica
    builds its own: ray_serve.py)."""
    app = FastAPI(title="TOPL Workbench", docs_url=None, redoc_url=None)
    models = {name: "steered", f"{name}:merged": "merged", f"{name}:base": "base"}
    created = int(time.time())
    key = app.state.engine_key = uuid.uuid4().hex
    if engine is not None:
        serve_engine(key, engine)

    app.add_middleware(_Guard, api_key=api_key, max_body=max_body)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid body"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        detail = first.get("msg", "invalid")
        if first.get("type") == "extra_forbidden":
            detail = "unknown field (see the OpenAI API's fields and the service's `steering`)"
        return _error(ServeError(400, f"{param or 'body'}: {detail}.", param))

    @app.exception_handler(ServeError)
    async def refused(_request: Request, exc: ServeError):
        return _error(exc)

    @app.get("/v1/models")
    async def list_models():
        data = [{"id": m, "object": "model", "created": created, "owned_by": "topl-workbench"} for m in models]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        messages = [m.model_dump() for m in body.messages]
        tok = _engine(key).tokenizer
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return await _complete(request, body, [prompt], chat=True)

    @app.post("/v1/completions")
    async def complete(body: CompletionRequest, request: Request):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not prompts or len(prompts) > 8:
            raise ServeError(400, "prompt: a string or a list of 1 to 8 strings.", "prompt")
        return await _complete(request, body, prompts, chat=False)

    def steering_of(body: CommonFields) -> Steering:
        kind = models.get(body.model)
        if kind is None:
            raise ServeError(404, f"model {body.model!r}: this service serves {list(models)}.", "model", "not_found")
        if kind == "base":  # the merged model with the adapter's update scaled to 0
            if body.steering is not None:
                raise ServeError(
                    400, "steering: the base model is not steered; ask for model " + repr(name), "steering"
                )
            return Steering(SteerConfig("conditional"), 0.0)
        if body.steering is None:
            return Steering(SteerConfig(), 0.0)
        if kind == "merged":
            raise ServeError(400, f"steering: {body.model!r} is the merged adapter; steer model {name!r}.", "steering")
        how, lam = body.steering.config()
        if how.spec.needs_head and not _engine(key).has_head:
            raise ServeError(
                400, f"steering.mode={how.mode!r} reads the adapter's head, which it has none of.", "steering.mode"
            )
        return Steering(how, lam)

    async def _complete(request: Request, body: CommonFields, prompts: list[str], chat: bool):
        body.check_penalties()
        steering = steering_of(body)
        sampling = Sampling(body.new_tokens(DEFAULT_NEW_TOKENS), body.temperature, body.top_p, body.seed, body.stops())
        engine = _engine(key)
        encoded = [engine.tokenizer(p, return_tensors="pt", add_special_tokens=False).input_ids for p in prompts]
        for ids in encoded:
            if ids.shape[1] > max_prompt_tokens:
                raise ServeError(
                    400,
                    f"the prompt is {ids.shape[1]} tokens; this service takes {max_prompt_tokens}.",
                    "messages" if chat else "prompt",
                )
        loop = asyncio.get_running_loop()
        choices: list[Choice] = []
        generations = []
        try:
            for p, ids in enumerate(encoded):
                for i in range(body.n):
                    choice = Choice(len(choices))
                    seeded = Sampling(**{**sampling.__dict__, "seed": (body.seed or 0) + i}) if body.n > 1 else sampling
                    put = _threadsafe(loop, choice.queue)
                    generations.append(engine.start(ids, steering, seeded, put))
                    choices.append(choice)
        except Busy:
            for g in generations:
                g.cancel()
            return _error(ServeError(429, "every slot is busy; retry shortly.", None, "rate_limit"), RETRY_AFTER_S)
        prompt_tokens = sum(ids.shape[1] for ids in encoded) * body.n
        reply = Reply(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", body.model, chat, steering)
        if body.stream:
            return StreamingResponse(
                _stream(request, reply, choices, generations, prompt_tokens, body), media_type="text/event-stream"
            )
        try:
            await _collect(request, choices)
        finally:
            for g in generations:
                g.cancel()
        return reply.whole(choices, prompt_tokens)

    return app


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


async def _collect(request: Request, choices: list[Choice]) -> None:
    """Every choice to its end; a client gone meanwhile ends the wait (its generations are cancelled)."""
    for choice in choices:
        while choice.finish_reason is None:
            try:
                piece = await asyncio.wait_for(choice.queue.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            absorb(choice, piece)
            if piece.error:
                raise ServeError(500, f"the generation failed: {piece.error}", None, "server_error")


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


def _error(error: ServeError, retry_after: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class _Guard:
    """Before a request reaches the app: its API key (a Bearer token, compared in constant time) and its body's size
    (the declared length, and the bytes as they are read: a body sent without a length is stopped at the limit)."""

    def __init__(self, app, api_key: str | None, max_body: int):
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                refusal = ServeError(401, "a valid API key is required (Authorization: Bearer KEY).", None, "auth")
                return await _error(refusal)(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _error(self._too_large())(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> ServeError:
        return ServeError(413, f"the request body is over {self.max_body} bytes.", None)
