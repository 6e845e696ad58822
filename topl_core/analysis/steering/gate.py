"""Detect, then steer (issue 43): the adapter's own token-level head decides, token by token while generating, when
another action's steering acts.

The head reads the hidden state after its layer m, which the forward that computes the next token's logits computes
anyway: a forward hook keeps it, so reading p(good) of each new token costs no forward of its own. A token the head
flags (p(good) < τ) that was chosen without steering is taken back: the KV cache is cropped to before the token it
follows, that token's forward runs again with the inner action's steering at λ on (the hooks' switch, hooks.py), and
the position is chosen again from the steered logits; steering then stays on for the next `keep` tokens. A token
chosen with steering on is not judged again (choosing it again would steer what is already steered), nor is the
first token (it is chosen from the prompt's forward, which the gate leaves unsteered like generated-position
steering does) or the end of turn (the head was trained on the response's tokens).

    GateOnHead(inner)       the action (modes.MODE_TABLE's "gated" wraps AddDirection along LoRA-B): the inner
                            action's λ axis, units and edits, the gate's settings (SteerConfig.tau, SteerConfig.keep)
    gated_decode(lm, prefix, cfg, head, switch, tau, keep) -> Iterator[SteeredText]   the loop, greedy or sampled
    Head(layer, linear)     a token-level head: p(good) = σ(linear(FinalNorm(hidden after decoder layer `layer`)))

Exact properties (tests/test_gated.py, fp32 and bf16): τ = 0 never takes a token back, so the text is the merged
model's; τ = 1 with keep ≥ max_new_tokens takes back the second token (every p(good) < 1) and steers every forward
from the first token's on, which is the always-on text of the inner mode on generated positions, token for token; the
neutral λ steers nothing, so the gate is off and the text is the merged model's (sampled too). Cropping the cache
gives the tokens a recomputation of every forward from the prompt gives.

Cost: a forward per generated token, as plain decoding, plus the last token's (the gate reads it), plus two per token
taken back (the preceding token's forward again, steered, and the new token's). SteeredText.gate counts them.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ...hardware.precision import autocast
from ...inference.generate import GenerationConfig, Prefill, stop_tokens
from ...inference.kv_cache import with_room
from ...models.architecture import decoder_layers, final_norm
from ...models.forward import head_probability
from ...models.loading import LoadedModel
from .actions import Decoding, SteeringAction
from .steered_text import GateCounts, Replacement, SteeredText


@dataclass(frozen=True)
class Head:
    """A token-level head: p(good) = σ(linear(FinalNorm(hidden state after decoder layer `layer`))) — a TOPL run's
    head.safetensors, or a probe head fitted on an adapter's hidden states (lora_a/probe_head.py)."""

    layer: int
    linear: torch.nn.Linear


@contextmanager
def _head_reader(model: torch.nn.Module, head: Head) -> Iterator[Callable[[], float]]:
    """While active, every forward from this thread keeps the hidden state after the head's layer at its last
    position; the function yielded gives the head's p(good) of it (called after the forward, in its autocast)."""
    owner, seen = threading.get_ident(), {}

    def keep_hidden(_module, _inputs, output):
        if threading.get_ident() == owner:
            seen["hidden"] = (output[0] if isinstance(output, tuple) else output)[:, -1:]

    norm = final_norm(model)
    handle = decoder_layers(model)[head.layer].register_forward_hook(keep_hidden)
    try:
        yield lambda: float(head_probability(head.linear, norm(seen.pop("hidden")))[0, -1])
    finally:
        handle.remove()


def token_chooser(cfg: GenerationConfig) -> Callable[[torch.Tensor], int]:
    """The next token from float32 logits: the argmax, or a draw from torch's global generator after transformers'
    own temperature and top-p warpers, as generate() samples (the same draws give the same tokens)."""
    if cfg.mode == "greedy":
        return lambda logits: int(logits.argmax())
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    warpers = (TemperatureLogitsWarper(cfg.temperature), TopPLogitsWarper(cfg.top_p))

    def sample(logits: torch.Tensor) -> int:
        scores = logits[None]
        for warp in warpers:
            scores = warp(None, scores)
        return int(torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1))

    return sample


class _Text:
    """The accepted tokens and their replacements, as text: each replacement's characters are fixed when its token is
    accepted (the tokens before it never change), so a snapshot only shifts them by the stripped leading space."""

    def __init__(self, tok):
        self.tok, self.ids, self.marks = tok, [], []

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def accept(self, token: int, taken_back: tuple[int, float, float | None] | None) -> None:
        """Append `token`; `taken_back` (original id, its p(good), the new token's) when it replaced another."""
        if taken_back is not None and taken_back[0] != token:
            before = self.decode(self.ids)
            original = self.decode([*self.ids, taken_back[0]])[len(before) :]
            end = len(self.decode([*self.ids, token]))
            self.marks.append((len(self.ids), original, len(before), end, taken_back[1], taken_back[2]))
        self.ids.append(token)

    def snapshot(self, counts: dict) -> SteeredText:
        raw = self.decode(self.ids)
        text, shift = raw.strip(), len(raw) - len(raw.lstrip())
        replacements = tuple(
            Replacement(pos, original, raw[start:end], max(start - shift, 0), min(end - shift, len(text)), p, after)
            for pos, original, start, end, p, after in self.marks
        )
        return SteeredText(text, replacements, GateCounts(tokens=len(self.ids), **counts), tuple(self.ids))


@torch.inference_mode()  # as stream_rows: no autograd bookkeeping in the decode loop
def gated_decode(
    lm: LoadedModel,
    prefix: Prefill,
    cfg: GenerationConfig,
    head: Head,
    switch,
    tau: float,
    keep: int,
) -> Iterator[SteeredText]:
    """Generate from `prefix` (the prompt's Prefill: decoded from a copy of its cache) with the gate of the module
    docstring, yielding the text so far after every accepted token (the last value is the generation). `switch`: the
    SteeringSwitch of the hooks.steer() context the caller is in; it is turned on exactly for the steered forwards.
    Sampling draws from torch's global generator (seed it first)."""
    tok, model = lm.tokenizer, lm.model
    cache, stop, choose = with_room(prefix.cache, cfg.max_new_tokens), stop_tokens(tok), token_chooser(cfg)
    decode = cfg.decode_on(model.device.type)
    text, counts = _Text(tok), {"taken_back": 0, "steered": 0, "forwards": 0}
    logits, logits_steered, window = prefix.logits, False, 0

    with _head_reader(model, head) as read:

        def forward(token: int, steered: bool) -> tuple[float, torch.Tensor]:
            """Run one token with the steering on or off: its p(good) and the next position's logits."""
            switch.on = steered
            with autocast(decode, model.device.type):
                ids = torch.tensor([[token]], device=model.device)
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
                p = read()
            counts["forwards"] += 1
            counts["steered"] += steered
            return p, out.logits[0, -1].float()

        switch.on = False
        while len(text.ids) < cfg.max_new_tokens:
            token, chosen_steered, taken_back = choose(logits), logits_steered, None
            if token not in stop:
                steer_next = window > 0
                window -= steer_next
                p, logits = forward(token, steer_next)
                logits_steered = steer_next
                if p < tau and not chosen_steered and text.ids:
                    cache.crop(-2)  # this token's and the previous one's entries: the previous runs again, steered
                    new = choose(forward(text.ids[-1], True)[1])
                    counts["taken_back"] += 1
                    window, p_new = keep, None
                    if new not in stop:
                        steer_next = window > 0
                        window -= steer_next
                        p_new, logits = forward(new, steer_next)
                        logits_steered = steer_next
                    taken_back, token = (token, p, p_new), new
            text.accept(token, taken_back)
            yield text.snapshot(counts)
            if token in stop:
                break


class GateOnHead(SteeringAction):
    """The inner action's steering, switched on only for the positions the adapter's head flags while generating
    (module docstring). Its λ axis, units, edits and vectors are the inner action's, so λ means what it means there;
    τ and keep are SteerConfig's `tau` and `keep`."""

    needs_head = True
    positions_apply = False  # the gate decides which forwards are steered; the prompt never is
    settings = ("tau", "keep")
    batches_rows = False  # each row's cache is cropped at its own positions: one λ at a time

    def __init__(self, inner: SteeringAction):
        self.inner = inner

    family = property(lambda self: self.inner.family)
    neutral = property(lambda self: self.inner.neutral)
    lambda_range = property(lambda self: self.inner.lambda_range)
    lambda_step = property(lambda self: self.inner.lambda_step)
    lambda_grid = property(lambda self: self.inner.lambda_grid)
    range_choices = property(lambda self: self.inner.range_choices)
    axis_title = property(lambda self: self.inner.axis_title)
    lambda_help = property(lambda self: self.inner.lambda_help)
    needs_direction = property(lambda self: self.inner.needs_direction)
    needs_lora = property(lambda self: self.inner.needs_lora)
    units_apply = property(lambda self: self.inner.units_apply)

    def edits(self, model, vectors, mode, units, lams, lora):
        return self.inner.edits(model, vectors, mode, units, lams, lora)

    def caption(self, mode, units):
        return self.inner.caption(mode, units) + " Steering acts only where the adapter's head flags a token."

    def unit_note(self, vectors, mode, units, lam=None):
        return self.inner.unit_note(vectors, mode, units, lam)

    def fingerprint(self, vectors, mode, units):
        return self.inner.fingerprint(vectors, mode, units)

    def generate(self, lm, documents, gen_cfg, task, how, run):
        out = []
        for i, document in enumerate(documents):
            if gen_cfg.mode == "sample":
                torch.manual_seed(gen_cfg.seed + i)  # as generate() seeds its batch
            out.append(_last(self.stream(lm, document, gen_cfg, task, how, run)))
        return out

    def stream(self, lm, document, gen_cfg, task, how, run: Decoding) -> Iterator[SteeredText]:
        run.switch.on = False  # the prompt is never steered
        prefix = run.prefill(document)
        # at the neutral λ the steering changes nothing: taking tokens back would only cost (and redraw a sample)
        tau = how.tau if float(run.lam) != self.neutral else 0.0
        yield from gated_decode(lm, prefix, gen_cfg, run.head(), run.switch, tau, how.keep)


def _last(items: Iterator[SteeredText]) -> SteeredText:
    last = None
    for last in items:
        pass
    assert last is not None, "a generation yields at least its first token"
    return last
