"""The service's wire format: OpenAI's completions and chat completions, with the workbench's two additions.

Requests (OpenAI's fields; unknown fields are refused by name; every input checked before any work starts):
    model        "<adapter>" (steered by `steering`; merged without it), "<adapter>:merged", "<adapter>:base", or a
                 steering alias "<adapter>@<mode>:<λ>[,<setting>=<value>…]" (e.g. "topl-smollm2@vector:2",
                 "topl-smollm2@gated:2,tau=0.9"): the steering named in the model, for clients that send no extra
                 field (lm-eval's loglikelihood requests); `serve --expose` lists some in /v1/models
    prompt       (completions) a string, a list of strings, a list of token ids or a list of such lists
    content      (chat) a string or OpenAI's parts, of which only {"type": "text", "text": ...} are read
    echo, logprobs (completions) the prompt's tokens with their log-probabilities as well (OpenAI's legacy shape,
                 what lm-eval's local-completions reads for a multiple-choice task); top_logprobs / logprobs: up to
                 MAX_TOP_LOGPROBS alternatives per token
    steering     {"mode": "vector", "lambda": 2, "units": ..., "positions": ..., "tau": ..., "keep": ...}: a mode of
                 the steering registry (runtime/modes.py) and SteerConfig's settings, each validated as
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
403 (a Host header not served: DNS rebinding), 404 (an unknown model: code "model_not_found"), 413 (a body over the
limit), 429 (every slot busy: Retry-After), 500 (a failure of the service's own, the request's generations ended).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..foundations.config_fields import field_infos
from ..runtime.modes import MODES, SteerConfig

MAX_TOKENS = 1024  # the most new tokens one request may ask for
MAX_N = 8
MAX_PROMPTS = 64  # prompts in one completions request (lm-eval's batch_size)
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 16  # OpenAI takes 4; lm-eval sends a task's every `until` and the end-of-text string
MAX_STOP_CHARS = 256
MIN_TEMPERATURE = 0.01  # below (and above 0): logits / T overflow float32, and the draw sees inf and NaN
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
ALIAS_MARK = "@"


class ServeError(Exception):
    """A request the service refuses: OpenAI's error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self, retry_after: int | None = None) -> JSONResponse:
        """The refusal as the HTTP answer: the body, the status and (a 429) when to retry."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def encodable(text: str, param: str) -> str:
    """`text`, or ServeError naming `param` when it holds what UTF-8 cannot encode (a lone surrogate such as
    "\\ud800", which JSON allows and no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ServeError(
            400,
            f"{param}: character {e.start} ({text[e.start]!r}) is not valid Unicode text (a lone surrogate).",
            param,
        ) from None
    return text


class SteeringField(BaseModel):
    """The `steering` body field: SteerConfig's settings and λ (`lambda`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: str = "vector"
    lam: float = Field(alias="lambda")
    units: str | None = None
    positions: str | None = None
    tau: float | None = None
    keep: int | None = None

    def config(self, where: str = "steering") -> tuple[SteerConfig, float]:
        """The SteerConfig and λ asked for; ServeError naming the field (`where`: the body's `steering`, or `model`
        for an alias) and what is allowed otherwise."""
        if self.mode not in MODES:
            raise ServeError(400, f"{where}: mode {self.mode!r}: choose one of {sorted(MODES)}.", _param(where, "mode"))
        spec = MODES[self.mode]
        given = {k: v for k, v in self.model_dump(exclude={"lam", "mode"}).items() if v is not None}
        for name in set(given) & set(field_infos(SteerConfig)) - {"units", "positions"} - set(spec.settings):
            raise ServeError(400, f"{where}: mode {self.mode!r} reads no {name}.", _param(where, name))
        try:
            how = SteerConfig(self.mode, **given)
        except ValueError as e:
            name = str(e).split("=")[0].removeprefix("SteerConfig.")
            info = field_infos(SteerConfig).get(name)
            hint = f" ({info.help})" if info is not None else ""
            raise ServeError(400, f"{where}: {e}{hint}", _param(where, name)) from None
        lo, hi = spec.lambda_bounds
        if spec.action.units_apply and how.units == "raw":  # the paper's formula: λ scales the vector itself
            lo, hi = -math.inf, math.inf
        if not (lo <= self.lam <= hi and math.isfinite(self.lam)):
            raise ServeError(
                400,
                f"{where}: λ={self.lam:g}: mode {self.mode!r} takes λ in [{lo:g}, {hi:g}].",
                _param(where, "lambda"),
            )
        return how, float(self.lam)


def _param(where: str, name: str) -> str:
    return f"{where}.{name}" if where == "steering" else where


def alias_steering(model: str) -> SteeringField:
    """The steering an alias's model name spells after its ALIAS_MARK: "<mode>:<λ>[,<setting>=<value>…]"
    (ServeError naming `model` when it spells none)."""
    spelled = model.split(ALIAS_MARK, 1)[1]
    mode, _, rest = spelled.partition(":")
    lam, *pairs = rest.split(",")
    fields: dict = {"mode": mode, "lambda": lam}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or name in ("mode", "lambda", "lam"):
            fields = {}
            break
        fields[name] = value
    try:
        return SteeringField.model_validate(fields)
    except ValidationError:
        example = f"{model.split(ALIAS_MARK, 1)[0]}{ALIAS_MARK}vector:2 or …{ALIAS_MARK}gated:2,tau=0.9"
        raise ServeError(
            400,
            f"model {model!r}: a steering alias is <adapter>{ALIAS_MARK}<mode>:<λ>[,<setting>=<value>…], "
            f"e.g. {example} (settings: units, positions, tau, keep).",
            "model",
        ) from None


def alias_name(name: str, how: SteerConfig, lam: float) -> str:
    """The alias of the adapter `name` that asks for `how` at λ (alias_steering reads it back)."""
    body = steering_body(how, lam)
    settings = "".join(f",{k}={v:g}" if isinstance(v, float) else f",{k}={v}" for k, v in list(body.items())[2:])
    return f"{name}{ALIAS_MARK}{how.mode}:{lam:g}{settings}"


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
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    user: str | None = None
    steering: SteeringField | None = None
    # accepted at OpenAI's defaults only (the service has no penalties): another value is refused
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @field_validator("temperature")
    @classmethod
    def _finite_draw(cls, t: float) -> float:
        if 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"0 (greedy) or at least {MIN_TEMPERATURE:g}; below, the sampling probabilities overflow")
        return t

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ServeError(
                400, f"stop: up to {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters.", "stop"
            )
        return tuple(encodable(s, "stop") for s in stops)

    def new_tokens(self, default: int) -> int:
        given = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return default if given is None else given

    def check_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ServeError(400, f"{name}: not supported by this service (leave it 0).", name)

    def top_logprobs_asked(self) -> int:
        """How many alternatives each token's log-probability comes with."""
        return 0


class ContentPart(BaseModel):
    """One part of a message's content (OpenAI's multi-part form); only text parts are read."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None
    name: str | None = None

    def text(self, param: str) -> str:
        """The message's text: its string, or its text parts joined (ServeError naming any other part)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return encodable(self.content, f"{param}.content")
        pieces = []
        for k, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise ServeError(
                    400,
                    f"{param}.content[{k}]: a part of type {part.type!r}; this service reads text parts only "
                    '({"type": "text", "text": ...}).',
                    f"{param}.content",
                )
            pieces.append(encodable(part.text, f"{param}.content"))
        return "".join(pieces)

    def plain(self, param: str) -> dict:
        """The message as a chat template reads it ({"role", "content"}; a developer message is a system message)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.text(param)}


class ChatRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_asked(self) -> int:
        return self.top_logprobs or 0


TokenIds = list[int]


class CompletionRequest(CommonFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS)  # 0: the prompt scored (with echo), nothing generated
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False

    def top_logprobs_asked(self) -> int:
        return self.logprobs or 0

    def prompts(self) -> list[str | TokenIds]:
        """The prompts, each a string or a list of token ids (ServeError: none, too many, an empty one)."""
        p = self.prompt
        prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise ServeError(400, f"prompt: a string, token ids, or a list of 1 to {MAX_PROMPTS} of either.", "prompt")
        for k, one in enumerate(prompts):
            if len(one) == 0:
                raise ServeError(
                    400, f"prompt[{k}]: empty; give at least one character or token to continue from.", "prompt"
                )
            if isinstance(one, str):
                encodable(one, "prompt")
        return prompts


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
