"""The service's wire format: OpenAI's completions and chat completions, with the workbench's two additions.

Requests (OpenAI's fields; unknown fields are refused by name):
    model        "<adapter>" (steered by `steering`; merged without it), "<adapter>:merged", "<adapter>:base"
    steering     {"mode": "vector", "lambda": 2, "units": ..., "positions": ..., "tau": ..., "keep": ...}: a mode of
                 the steering registry (analysis/steering/modes.py) and SteerConfig's settings, each validated as
                 SteerConfig validates it; λ within the mode's bounds (SteeringMode.lambda_bounds; in raw units,
                 any finite λ)
Responses: OpenAI's, where every generated token carries the adapter's p(good) as `p_good`:
    chat         choices[i].logprobs.content[k] = {"token", "logprob", "bytes", "top_logprobs": [], "p_good",
                 "token_id"}; completions: choices[i].logprobs = {"tokens", "token_logprobs", "top_logprobs",
                 "text_offset", "p_good", "token_ids"}
    verdict      choices[i].verdict = {"threshold", "flagged", "tokens", "taken_back": [{"position", "original",
                 "replacement", "replaced", "p_good", "p_good_after"}], "replacements": those of taken_back whose
                 token changed} (streams: in each chunk, for its tokens)
Errors: OpenAI's {"error": {"message", "type", "param", "code"}}, with status 400 (the field and what is allowed), 401,
404 (an unknown model), 413 (a body over the limit), 429 (every slot busy: Retry-After).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..analysis.steering.modes import MODES, SteerConfig
from ..foundations.config_fields import field_infos

MAX_TOKENS = 1024  # the most new tokens one request may ask for
MAX_N = 8


class ServeError(Exception):
    """A request the service refuses: OpenAI's error body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


class SteeringField(BaseModel):
    """The `steering` body field: SteerConfig's settings and λ (`lambda`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: str = "vector"
    lam: float = Field(alias="lambda")
    units: str | None = None
    positions: str | None = None
    tau: float | None = None
    keep: int | None = None

    def config(self) -> tuple[SteerConfig, float]:
        """The SteerConfig and λ asked for; ServeError naming the field and what is allowed otherwise."""
        if self.mode not in MODES:
            raise ServeError(400, f"steering.mode={self.mode!r}: choose one of {sorted(MODES)}.", "steering.mode")
        spec = MODES[self.mode]
        given = {k: v for k, v in self.model_dump(exclude={"lam", "mode"}).items() if v is not None}
        for name in set(given) & set(field_infos(SteerConfig)) - {"units", "positions"} - set(spec.settings):
            raise ServeError(400, f"steering.{name}: mode {self.mode!r} reads no {name}.", f"steering.{name}")
        try:
            how = SteerConfig(self.mode, **given)
        except ValueError as e:
            name = str(e).split("=")[0].removeprefix("SteerConfig.")
            info = field_infos(SteerConfig).get(name)
            hint = f" ({info.help})" if info is not None else ""
            raise ServeError(400, f"steering: {e}{hint}", f"steering.{name}") from None
        lo, hi = spec.lambda_bounds
        if spec.action.units_apply and how.units == "raw":  # the paper's formula: λ scales the vector itself
            lo, hi = -math.inf, math.inf
        if not (lo <= self.lam <= hi and math.isfinite(self.lam)):
            raise ServeError(
                400, f"steering.lambda={self.lam:g}: mode {self.mode!r} takes λ in [{lo:g}, {hi:g}].", "steering.lambda"
            )
        return how, float(self.lam)


class CommonFields(BaseModel):
    """What both endpoints read."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    steering: SteeringField | None = None
    # accepted at OpenAI's defaults only (the service has no penalties): another value is refused
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ServeError(400, "stop: up to 4 non-empty strings.", "stop")
        return tuple(stops)

    def new_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ServeError(400, f"{name}: not supported by this service (leave it 0).", name)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)


class CompletionRequest(CommonFields):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=0)
    echo: bool = False


def steering_body(how: SteerConfig, lam: float) -> dict:
    """The `steering` body field that asks for `how` at λ (only what differs from SteerConfig's defaults)."""
    defaults = SteerConfig(how.mode)
    body = {"mode": how.mode, "lambda": float(lam)}
    body.update({k: v for k, v in how.key().items() if k != "mode" and v != getattr(defaults, k)})
    return body


def client_code(model: str, how: SteerConfig, lam: float, prompt: str, url: str = "http://127.0.0.1:8000/v1") -> dict:
    """The request for these settings, ready to paste: {"python": the official openai client's call, "curl": …}
    (what the Steering page shows under its texts)."""
    steering = steering_body(how, lam)
    messages = [{"role": "user", "content": prompt}]
    python = f"""import openai

client = openai.OpenAI(base_url={url!r}, api_key="unused")
reply = client.chat.completions.create(
    model={model!r},
    messages={messages!r},
    max_tokens=64,
    temperature=0,
    extra_body={{"steering": {steering!r}}},
)
print(reply.choices[0].message.content)
print([(t.token, t.p_good) for t in reply.choices[0].logprobs.content])  # the adapter's p(good) per token
"""
    body = {"model": model, "messages": messages, "max_tokens": 64, "temperature": 0, "steering": steering}
    quoted = json.dumps(body, ensure_ascii=False).replace("'", "'\\''")
    curl = f"curl {url}/chat/completions -H 'Content-Type: application/json' -d '{quoted}'"
    return {"python": python, "curl": curl}
