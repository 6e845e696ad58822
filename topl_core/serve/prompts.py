"""A batcher's prompt forwards (serve/batch.py): a request's prompt run steered (where its mode steers the prompt) or
plain, whole or only through the head's layer (a twin's: it is read there and nowhere above), from the prompt cache
(inference/prompt_cache.py) when it holds that forward; or scored, its own tokens read by the forward (an echo).

    prompts = PromptForwards(lm, vectors, lora, head, precision, max_bytes)
    held, logits = prompts.run(ids, steered, through=None)   each layer's (keys, values), 1 × heads × positions ×
        head size; the last position's logits (vocabulary, float32), None for a forward stopped after `through`
    held, logits, scores = prompts.scored(ids, steered, top)  and its PromptScores (run every time: the cache keeps
        the last position's logits only)
    held, logits, plain = prompts.run_with_twin(ids, steered, through)   run(ids, steered) and its twin's
        run(ids, None, through), sharing the layers below the steering's lowest site where neither is cached
    prompts.cache                                             the PromptCache (its stats: hits and misses)
    prompts.replayed                                          the layers steered prompts took from earlier forwards

An entry's key is the prompt's token ids, its steering where it has one (a steered prompt never reads a plain one's
entry), and where the forward stopped: a twin's shorter forward never answers a whole one; a whole one answers both.

A steered prompt and its twin's plain one are the same forward below the lowest layer the steering edits (the demo
adapter's vector mode: layers 16–19 of SmolLM2's 30). So the twin's runs first, through the head's layer, keeping its
layers below that site, and the steered one takes them — their keys, values and output, the very tensors the twin's
forward computed with the same code on the same inputs — and computes the rest (inference/prompt_layers.py, which
the Steering page's prompts run through too). Modes that edit layer 0 (scaling the adapter's update) share nothing.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Mapping

import torch

from ..hardware.precision import ResolvedPrecision
from ..inference.generate import prompt_forward
from ..inference.prompt_cache import PromptCache, tensor_bytes
from ..inference.prompt_layers import last_resumed, plain_below
from ..models.architecture import decoder_layers
from ..models.forward import Head, HeadReader
from ..models.loading import LoadedModel
from ..runtime.hooks import first_layer
from ..runtime.modes import steer
from ..runtime.sites import LoraWeights, Site
from ..runtime.vectors import SteeringVectors
from .echo import PromptScores, prompt_layers, prompt_scores
from .row_steering import Steering

Held = list[tuple[torch.Tensor, torch.Tensor]]


class PromptForwards:
    """The prompt forwards of one model (the module docstring); called from the batcher's thread."""

    def __init__(
        self,
        lm: LoadedModel,
        vectors: SteeringVectors,
        lora: Callable[[], Mapping[Site, LoraWeights]],
        head: Head | None,
        precision: ResolvedPrecision,
        max_bytes: int,
    ):
        self.lm, self.vectors, self._lora, self.head, self.precision = lm, vectors, lora, head, precision
        self.cache: PromptCache = PromptCache(max_bytes=max_bytes)
        self.replayed = 0

    def run(
        self, ids: torch.Tensor, steered: Steering | None, through: int | None = None
    ) -> tuple[Held, torch.Tensor | None]:
        """The prompt `ids` (1 × positions) steered by `steered` (None: plain), through decoder layer `through`
        (None: all of them), from the cache or run and kept there."""
        hit = self._lookup(ids, steered, through)
        return hit if hit is not None else self._forward(ids, steered, through)

    def run_with_twin(
        self, ids: torch.Tensor, steered: Steering, through: int | None
    ) -> tuple[Held, torch.Tensor, Held]:
        """run(ids, steered)'s (held, logits) and run(ids, None, through)'s held (the module docstring): where neither
        is cached and the steering edits no layer below `shared` ≥ 1 (within the twin's layers), the twin's forward
        runs first and the steered one replays its layers below `shared`."""
        whole, plain = self._lookup(ids, steered, None), self._lookup(ids, None, through)
        shared = self._shared_layers(steered, through) if whole is None and plain is None else 0
        if not shared:
            whole = whole or self._forward(ids, steered, None)
            return *whole, (plain or self._forward(ids, None, through))[0]
        with plain_below(self.lm.model, shared):  # the twin's forward keeps its layers below `shared`
            held, _ = self._kept(ids, None, *prompt_forward(self.lm, ids, self.precision, through=through))
        whole = self._forward(ids, steered, None)  # below its lowest site (`shared`), the twin's layers
        return *whole, held

    def _forward(self, ids: torch.Tensor, steered: Steering | None, through: int | None):
        """The prompt's forward run (no lookup) and kept: run()'s after a miss."""
        with self._steering(steered):
            cache, last = prompt_forward(self.lm, ids, self.precision, through=through)
        self.replayed += last_resumed()  # a steered prompt's layers below its lowest site, from an earlier forward
        return self._kept(ids, steered, cache, last)

    def _lookup(self, ids: torch.Tensor, steered: Steering | None, through: int | None):
        """The cached forward of the prompt under `steered` that reaches `through` (a whole one, else one stopped
        there), or None."""
        for depth in dict.fromkeys((None, through)):
            hit = self.cache.get(_key(ids, steered, depth))
            if hit is not None:
                return hit
        return None

    def _kept(self, ids, steered: Steering | None, cache, last) -> tuple[Held, torch.Tensor | None]:
        """A forward's (held, logits), kept in the cache: a whole one's (with logits) under the depth None."""
        held, logits = prompt_layers(cache), None if last is None else last[0]
        depth = None if logits is not None else len(held) - 1  # a stopped forward holds its layers up to its last
        kept = [t for kv in held for t in kv] + ([logits] if logits is not None else [])
        self.cache.put(_key(ids, steered, depth), (held, logits), tensor_bytes(*kept))
        return held, logits

    def _shared_layers(self, steered: Steering, through: int | None) -> int:
        """How many of the lowest layers a steered prompt shares with its twin's, through `through`: those below the
        lowest layer the steering edits (0: none, where it edits layer 0, none at all, or none within the twin's)."""
        how = steered.how
        lora = self._lora() if how.spec.action.needs_lora else None
        lam = torch.tensor(float(steered.lam), dtype=torch.float64)
        edits = how.spec.action.edits(self.lm.model, self.vectors, how.spec, how.units, lam, lora)
        lowest = first_layer(self.lm.model, edits) if edits else 0  # what the steered forward declares (hooks.py)
        twin_depth = len(decoder_layers(self.lm.model)) - 1 if through is None else through
        return lowest if lowest <= twin_depth + 1 else 0

    def scored(self, ids: torch.Tensor, steered: Steering | None, top: int) -> tuple[Held, torch.Tensor, PromptScores]:
        """The prompt run as run() runs it, every position's logits kept, and its own tokens scored with `top`
        alternatives each; p(good) read on the plain prompt (a second, plain forward when the prompt is steered)."""
        reader = HeadReader(self.lm.model, self.head, 1, every=True)
        with self._steering(steered), nullcontext() if steered else reader:
            cache, logits = prompt_forward(self.lm, ids, self.precision, every_position=True)
        if steered is not None and self.head is not None:
            with reader:  # kept: a twin's prompt reads it from the cache
                self._kept(ids, None, *prompt_forward(self.lm, ids, self.precision))
        return prompt_layers(cache), logits[0, -1].float(), prompt_scores(ids[0], logits[0], top, reader.read())

    def _steering(self, steered: Steering | None):
        if steered is None:
            return nullcontext()
        lora = self._lora() if steered.how.spec.action.needs_lora else None
        return steer(self.lm.model, self.vectors, steered.lam, steered.how, lora)


def _key(ids: torch.Tensor, steered: Steering | None, depth: int | None) -> tuple:
    """A prompt forward's cache key: its tokens, its steering (None: plain), the layer it stopped after (None:
    whole)."""
    return tuple(ids[0].tolist()), None if steered is None else (steered.how, float(steered.lam)), depth
