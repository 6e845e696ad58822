"""The remote tokenizer's endpoints, as vLLM serves them and lm-eval's remote tokenizer reads them: /tokenize,
/detokenize, /tokenizer_info (app.py routes them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .engine import ServeEngine
from .protocol import ServeError, TokenIds, encodable


class TokenizeRequest(BaseModel):
    """/tokenize's body (vLLM's): a prompt, or chat messages, and whether the tokenizer adds its special tokens."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: TokenIds


def tokenize(engine: ServeEngine, body: TokenizeRequest) -> list[int]:
    tok = engine.tokenizer
    if body.prompt is not None:
        return tok(encodable(body.prompt, "prompt"), add_special_tokens=body.add_special_tokens).input_ids
    if body.messages is not None:
        try:
            text = tok.apply_chat_template(
                body.messages, tokenize=False, add_generation_prompt=body.add_generation_prompt
            )
        except Exception as e:
            raise ServeError(400, f"messages: the model's chat template refuses them ({e}).", "messages") from None
        return tok(encodable(text, "messages"), add_special_tokens=False).input_ids
    raise ServeError(400, "give `prompt` (a string) or `messages`.", "prompt")


def tokenizer_info(engine: ServeEngine) -> dict:
    """What a remote tokenizer needs to tokenize as this service does (vLLM's /tokenizer_info fields)."""
    tok = engine.tokenizer
    return {
        "tokenizer_class": type(tok).__name__,
        "model_max_length": engine.context_window,
        "max_model_len": engine.context_window,
        "vocab_size": engine.vocabulary,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "add_bos_token": getattr(tok, "add_bos_token", None),
        "chat_template": tok.chat_template,
    }


def check_ids(engine: ServeEngine, ids: list[int], param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < engine.vocabulary), None)
    if bad is not None:
        raise ServeError(
            400, f"{param}: token id {bad} is not in the vocabulary (0 to {engine.vocabulary - 1}).", param
        )
