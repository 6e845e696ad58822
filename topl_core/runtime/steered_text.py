"""A steered generation: its text and, where a gate decided when steering acted (gate.py), the tokens the head took
back and what replaced them, with the gate's counts.

    SteeredText(text, replacements=(), gate=None, token_ids=())   gate None: steering acted on every forward
                                                                  (always-on modes, whose token ids are not kept)
    Replacement(position, original, replacement, start, end, p_good, p_good_after)
    GateCounts(tokens, taken_back, steered, forwards)
    SteeredText.note() -> str | None                    one line for the CLI and the pages ("3 of 48 tokens replaced …")
    SteeredText.to_json() / from_json(d)                what a deck stores
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Replacement:
    """A generated token the head flagged (p(good) < τ) and the steered regeneration changed. position: its index
    among the generated tokens; original / replacement: both tokens as text; start, end: the replacement's characters
    in SteeredText.text; p_good: the head's p(good) of the original, p_good_after of the replacement."""

    position: int
    original: str
    replacement: str
    start: int
    end: int
    p_good: float
    p_good_after: float


@dataclass(frozen=True)
class GateCounts:
    """tokens: generated tokens (the end of turn included); taken_back: tokens the head flagged and the position
    generated again with steering on (those whose token changed are the replacements); steered: forwards made with
    steering on; forwards: every forward after the prompt's."""

    tokens: int = 0
    taken_back: int = 0
    steered: int = 0
    forwards: int = 0


@dataclass(frozen=True)
class SteeredText:
    """One steered generation (see the module docstring).

    Example: ``g = session.grid_generations(document, [2.0], how=SteerConfig("gated"))[0]; g.text, g.note()``"""

    text: str
    replacements: tuple[Replacement, ...] = ()
    gate: GateCounts | None = None
    token_ids: tuple[int, ...] = ()  # the generated tokens, end of turn included (gated generations)

    def note(self) -> str | None:
        """How much the gate did, in one line; None where no gate ran."""
        if self.gate is None:
            return None
        g = self.gate
        return (
            f"gated: {len(self.replacements)} of {g.tokens} tokens replaced ({g.taken_back} flagged and generated "
            f"again with steering on; {g.steered} of {g.forwards} forwards steered)"
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "SteeredText":
        gate = d.get("gate")
        return cls(
            d["text"],
            tuple(Replacement(**r) for r in d.get("replacements") or ()),
            None if gate is None else GateCounts(**gate),
            tuple(d.get("token_ids") or ()),
        )
