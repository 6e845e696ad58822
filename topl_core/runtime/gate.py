"""Detect, then steer: the adapter's own token-level head judges, token by token while generating, when a mode's
steering acts — a judge in the one decode loop (inference/decode.py).

The head reads the hidden state after its layer m, which the forward that computes the next token's logits computes
anyway: a forward hook reads p(good) of each new token there, so it costs no forward of its own. A token the head flags
(p(good) < τ) that was chosen without steering is taken back: the loop crops the KV cache to before the token it
follows, runs that token's forward again with the steering on (the hooks' switch, hooks.py), and chooses the position
again from the steered logits; steering then stays on for the next `keep` tokens. A token chosen with steering on is
not judged again (choosing it again would steer what is already steered), nor is the first token (it is chosen from
the prompt's forward, which the gate leaves unsteered like generated-position steering does) or the end of turn (the
head was trained on the response's tokens).

    Head(layer, linear)       a token-level head: p(good) = σ(linear(FinalNorm(hidden after decoder layer `layer`)))
    HeadGate                  a mode's judge (modes.MODE_TABLE's "gated": the LoRA-B vector plus this judge): its
                              settings (SteerConfig.tau, SteerConfig.keep) and, per generation,
                              HeadGate.judging(model, head, switch, neutral, tau, keep) -> GateJudge (the head
                              read through a hook), or HeadGate.judge(switch, read, …) with the readings given
    GateJudge                 the loop's judge for one generation; .snapshot(tokens) -> SteeredText with what it
                              replaced and its counts

Exact properties (tests/test_gated.py, fp32 and bf16): τ = 0 never takes a token back, so the text is the merged
model's; τ = 1 with keep ≥ max_new_tokens takes back the second token (every p(good) < 1) and steers every forward
from the first token's on, which is the always-on text of the mode's action on generated positions, token for token;
the neutral λ steers nothing, so the gate is off and the text is the merged model's (sampled too). Cropping the cache
gives the tokens a recomputation of every forward from the prompt gives.

Cost: a forward per generated token, as plain decoding, plus the last token's (the gate reads it), plus two per token
taken back (the preceding token's forward again, steered, and the new token's). SteeredText.gate counts them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple, Sequence

import torch

from ..inference.decode import Judge
from ..models.forward import Head, HeadReader
from .hooks import SteeringSwitch
from .steered_text import GateCounts, Replacement, SteeredText


@contextmanager
def _head_reader(model: torch.nn.Module, head: Head) -> Iterator[Callable[[], float]]:
    """While active, every forward from this thread reads the head's p(good) of its last position (models.forward's
    HeadReader); the function yielded gives the last forward's, once."""
    with HeadReader(model, head) as reader:
        yield lambda: float(reader.take()[0])


class HeadGate:
    """The judge of a gated mode (the module docstring): the SteerConfig settings it reads, and the judge of one
    generation."""

    settings: tuple[str, ...] = ("tau", "keep")
    caption = " Steering acts only where the adapter's head flags a token."

    @contextmanager
    def judging(
        self, model: torch.nn.Module, head: Head, switch: SteeringSwitch, neutral: bool, tau: float, keep: int
    ) -> Iterator["GateJudge"]:
        """The judge of one generation while the head is read. `neutral`: λ is the mode's neutral value, where the
        steering changes nothing, so taking tokens back would only cost (and redraw a sample): nothing is judged."""
        with _head_reader(model, head) as read:
            yield self.judge(switch, read, neutral, tau, keep)

    def judge(
        self, switch: SteeringSwitch, read: Callable[[], float], neutral: bool, tau: float, keep: int
    ) -> "GateJudge":
        """The judge of one generation whose head readings `read()` gives (the last forward's p(good) of its token):
        for a decoder that reads the head itself (a server batching several generations' forwards)."""
        switch.on = False  # the prompt is never steered
        return GateJudge(switch, read, 0.0 if neutral else tau, keep)


class TakeBack(NamedTuple):
    """A token the gate took back: its position among the generated tokens, the token and its p(good), and what the
    steered forward chose there (the same token, or a replacement) with its p(good) (None: an end of turn)."""

    position: int
    original: int
    new: int
    p_good: float
    p_good_after: float | None


class GateJudge(Judge):
    """The head gate's judge of one generation (inference/decode.Judge): steering on for the forwards it asks for."""

    def __init__(self, switch: SteeringSwitch, read: Callable[[], float], tau: float, keep: int):
        self._switch, self._read, self._tau, self._keep = switch, read, tau, keep
        self._window = 0  # forwards still steered after a take-back
        self._last_steered = False  # whether the last forward (whose logits choose the next token) was steered
        self._chosen_steered = False  # whether the token being judged was chosen from steered logits
        self._taken: tuple[int, float] | None = None  # (position, p(good)) of the token just taken back
        self.taken_back: list[TakeBack] = []  # every take-back, the new token the same or not
        self.counts = {"taken_back": 0, "steered": 0, "forwards": 0}

    def before_forward(self, redo: bool) -> None:
        if redo:
            steered = True
        else:
            self._chosen_steered = self._last_steered
            steered = self._window > 0
            self._window -= steered
        self._switch.on = self._last_steered = steered
        self.counts["forwards"] += 1
        self.counts["steered"] += steered

    def take_back(self, token: int, accepted: Sequence[int]) -> bool:
        p = self._read()
        if p >= self._tau or self._chosen_steered or not accepted:
            return False
        self._taken = (len(accepted), p)
        self.counts["taken_back"] += 1
        self._window = self._keep
        return True

    def replaced(self, original: int, new: int, forwarded: bool) -> None:
        position, p = self._taken
        self.taken_back.append(TakeBack(position, original, new, p, self._read() if forwarded else None))

    def snapshot(self, tok, tokens: Sequence[int]) -> SteeredText:
        """The generation so far (`tokens`, the loop's), with what the gate replaced and its counts."""
        decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)  # noqa: E731
        raw = decode(tokens)
        text, shift = raw.strip(), len(raw) - len(raw.lstrip())
        replacements = []
        for position, original, new, p, p_new in (t for t in self.taken_back if t.new != t.original):
            before = decode(tokens[:position])
            start, end = len(before), len(decode(tokens[: position + 1]))
            original_text = decode([*tokens[:position], original])[start:]
            replacements.append(
                Replacement(
                    position,
                    original_text,
                    raw[start:end],
                    max(start - shift, 0),
                    min(end - shift, len(text)),
                    p,
                    p_new,
                )
            )
        counts = GateCounts(tokens=len(tokens), **self.counts)
        return SteeredText(text, tuple(replacements), counts, tuple(tokens))
