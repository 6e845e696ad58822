"""The one decode loop: every generation after its prompt's forward — eager or through a compiled step, greedy or
sampled, one row or a batch of rows (a λ per row), with or without a judge that takes tokens back — runs here.

    decode(logits, max_new_tokens, stop, forward, choose, judge=None, crop=None) -> Iterator[list[list[int]]]
        from the first new token's `logits` (rows × vocabulary): every row's new tokens so far after each step
    decoded_texts(tok, steps) -> Iterator[list[str]]   the same steps as text (stripped, special tokens dropped)
    final_texts(tok, steps) -> list[str]                every row's whole text (only the last step decoded)
    stop_tokens(tok) -> set[int]        the ids a response ends on
    Judge                               the loop's place for a judge (one row): before each forward it may set up
        what the forward does (e.g. turn steering on); after a token's forward it may take the token back — the
        cache loses the token's entry and its predecessor's, the predecessor runs again (redo) and the position is
        chosen again from its new logits (runtime/gate.py's head gate is one)

A forward is a function of the tokens just chosen (rows × 1) giving the next logits (rows × vocabulary, float32): an
eager model forward with a KV cache (generate.stream_rows) or a compiled step (compiled_decode.StepDecoder). What it
adds (steering, autocast) is the caller's.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

Forward = Callable[[torch.Tensor], torch.Tensor]
Choose = Callable[[torch.Tensor], list[int]]


class Judge:
    """What the loop asks a judge, one row at a time (the base judges nothing and takes nothing back)."""

    def before_forward(self, redo: bool) -> None:
        """Called before every forward of a generated token; `redo`: the forward of the token before one taken back,
        run again."""

    def take_back(self, token: int, accepted: Sequence[int]) -> bool:
        """After `token`'s forward: whether to take it back. `accepted`: the tokens before it."""
        return False

    def replaced(self, original: int, new: int, forwarded: bool) -> None:
        """`new` took the place of `original`, taken back; `forwarded`: new's forward ran (it is not a stop token)."""


def stop_tokens(tok) -> set[int]:
    """The token ids that end a response (the tokenizer's end-of-turn ids), as transformers' generate stops on them."""
    return set(tok.eos_token_id if isinstance(tok.eos_token_id, list) else [tok.eos_token_id]) - {None}


def decode(
    logits: torch.Tensor,
    max_new_tokens: int,
    stop: set[int],
    forward: Forward,
    choose: Choose,
    judge: Judge | None = None,
    crop: Callable[[int], None] | None = None,
) -> Iterator[list[list[int]]]:
    """Decode from the first new token's `logits` (rows × vocabulary): after each step, every row's new tokens so far
    (the stop token included; a row that wrote one is kept as it ended), until every row has stopped or `max_new_tokens`
    are written. `forward(ids)` runs the tokens just chosen (rows × 1) and gives the next logits; `choose` picks each
    row's token (generate.GenerationConfig.chooser: the argmax or a draw). With a `judge` (one row; `crop(n)` drops the
    cache's last n positions) each token's forward runs before the token is yielded, so that the judge can take it back
    (the module docstring); without one, the forward runs after the yield (the reader sees the token a forward
    sooner)."""
    rows = logits.shape[0]
    if judge is not None and (rows != 1 or crop is None):
        raise ValueError("a judge decodes one row, and takes tokens back through `crop`.")
    new: list[list[int]] = [[] for _ in range(rows)]
    live = [True] * rows

    def run(tokens: Sequence[int]) -> torch.Tensor:
        return forward(torch.tensor(tokens, device=logits.device)[:, None])

    for n in range(1, max_new_tokens + 1):
        tokens = choose(logits)
        judged = judge is not None and tokens[0] not in stop
        if judged:
            judge.before_forward(redo=False)
            logits = run(tokens)
            if judge.take_back(tokens[0], new[0]):
                crop(2)  # the token's entry and its predecessor's: the predecessor runs again
                judge.before_forward(redo=True)
                original, tokens = tokens[0], choose(run(new[0][-1:]))
                forwarded = tokens[0] not in stop
                if forwarded:
                    judge.before_forward(redo=False)
                    logits = run(tokens)
                judge.replaced(original, tokens[0], forwarded)
        for r in range(rows):
            if live[r]:
                new[r].append(tokens[r])
                live[r] = tokens[r] not in stop
        yield [list(t) for t in new]
        if not any(live) or n == max_new_tokens:
            return
        if not judged:
            logits = run(tokens)


def decoded_texts(tok, steps: Iterator[list[list[int]]]) -> Iterator[list[str]]:
    """decode()'s steps as every row's text so far (stripped, special tokens dropped)."""
    for tokens in steps:
        yield [tok.decode(t, skip_special_tokens=True).strip() for t in tokens]


def final_texts(tok, steps: Iterator[list[list[int]]]) -> list[str]:
    """Every row's whole text: the last of decode()'s steps decoded, the steps before it not."""
    *_, last = steps
    (texts,) = decoded_texts(tok, iter([last]))
    return texts
