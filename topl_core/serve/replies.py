"""What the service answers, as OpenAI writes it: a whole completion or its stream chunks, each choice with its tokens'
log-probabilities and p(good) and its verdict (protocol.py documents the shape), gathered from a generation's chunks.

    choice = Choice(index); absorb(choice, chunk)          a choice's chunks as they come
    reply = Reply(id, model, chat, steering); reply.whole(choices, prompt_tokens) / reply.chunk(choice, chunk, first)
    sse(payload)                                           one server-sent event
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass, field

from ..foundations.presets import FLAG_THRESHOLD
from .engine import Chunk, TakenBack, TokenVerdict
from .row_steering import Steering


@dataclass
class Choice:
    """One choice's chunks as they come (filled from the generation's thread through the event loop)."""

    index: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    echo_text: str = ""  # an echo's prompt, as its text starts
    prompt: list[TokenVerdict] = field(default_factory=list)  # an echo's prompt tokens
    text: str = ""
    tokens: list[TokenVerdict] = field(default_factory=list)
    taken_back: list[TakenBack] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0


class Reply:
    """How a completion's choices are written: whole, or as stream chunks."""

    def __init__(self, id: str, model: str, chat: bool, steering: Steering):
        self.id, self.model, self.chat, self.created = id, model, chat, int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        judge = steering.how.spec.judge
        self.threshold = float(steering.how.tau) if judge is not None else FLAG_THRESHOLD

    def verdict(self, tokens: list[TokenVerdict], taken_back: list[TakenBack], threshold: float) -> dict:
        known = [t.p_good for t in tokens if t.p_good is not None]
        takes = [dataclasses.asdict(t) for t in taken_back]
        return {
            "threshold": threshold,
            "tokens": len(tokens),
            "flagged": sum(p < threshold for p in known) if known else None,
            "taken_back": takes,
            "replacements": [t for t in takes if t["replaced"]],
        }

    def logprobs(self, tokens: list[TokenVerdict]) -> dict:
        if self.chat:
            content = [
                {
                    "token": t.token,
                    "logprob": t.logprob,
                    "bytes": list(t.token.encode()),
                    "top_logprobs": [
                        {"token": text, "logprob": lp, "bytes": list(text.encode())} for text, lp in t.top
                    ],
                    "p_good": t.p_good,
                    "token_id": t.token_id,
                }
                for t in tokens
            ]
            return {"content": content, "refusal": None}
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        # OpenAI's legacy shape: top_logprobs a dict per token (None where nothing precedes it), or None when no
        # alternatives were asked for
        asked = any(t.top for t in tokens)
        return {
            "tokens": [t.token for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top) if t.logprob is not None else None for t in tokens] if asked else None,
            "text_offset": offsets,
            "p_good": [t.p_good for t in tokens],
            "token_ids": [t.token_id for t in tokens],
        }

    def choice(self, index, text, tokens, taken_back, finish, threshold, delta=False, first=False) -> dict:
        out: dict = {"index": index}
        if self.chat:
            if delta:
                out["delta"] = {
                    **({"role": "assistant"} if first else {}),
                    **({"content": text} if text or first else {}),
                }
            else:
                out["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            out["text"] = text
        out["logprobs"] = self.logprobs(tokens)
        out["finish_reason"] = finish
        out["verdict"] = self.verdict([t for t in tokens if not t.prompt], taken_back, threshold)
        return out

    def whole(self, choices: list[Choice], prompt_tokens: int) -> dict:
        threshold = self.threshold
        completion = sum(c.completion_tokens for c in choices)
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [
                self.choice(
                    c.index, c.echo_text + c.text, c.prompt + c.tokens, c.taken_back, c.finish_reason, threshold
                )
                for c in choices
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            },
        }

    def chunk(self, choice: Choice, piece: Chunk, first: bool) -> dict:
        threshold = self.threshold
        body = self.choice(
            choice.index,
            (choice.echo_text if piece.prompt else "") + piece.text,
            [*piece.prompt, *piece.tokens],
            list(piece.taken_back),
            piece.finish_reason,
            threshold,
            delta=True,
            first=first,
        )
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [body],
        }


def absorb(choice: Choice, piece: Chunk) -> None:
    choice.prompt.extend(piece.prompt)
    choice.text += piece.text
    choice.tokens.extend(piece.tokens)
    choice.taken_back.extend(piece.taken_back)
    if piece.finish_reason is not None:
        choice.finish_reason, choice.completion_tokens = piece.finish_reason, piece.completion_tokens


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
