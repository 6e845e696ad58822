"""A batcher's prompt forwards (serve/batch.py): a request's prompt run steered (where its mode steers the prompt) or
plain, whole or only through the head's layer (a twin's: it is read there and nowhere above), from the prompt cache
(inference/prompt_cache.py) when it holds that forward; or scored, its own tokens read by the forward (an echo).

    prompts = PromptForwards(lm, vectors, lora, head, precision, max_bytes)
    held, logits = prompts.run(ids, steered, through=None)   each layer's (keys, values), 1 × heads × positions ×
        head size; the last position's logits (vocabulary, float32), None for a forward stopped after `through`
    held, logits, scores = prompts.scored(ids, steered, top)  and its PromptScores (run every time: the cache keeps
        the last position's logits only)
    prompts.cache                                             the PromptCache (its stats: hits and misses)

An entry's key is the prompt's token ids, its steering where it has one (a steered prompt never reads a plain one's
entry), and where the forward stopped: a twin's shorter forward never answers a whole one; a whole one answers both.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Mapping

import torch

from ..hardware.precision import ResolvedPrecision
from ..inference.generate import prompt_forward
from ..inference.prompt_cache import PromptCache, tensor_bytes
from ..models.forward import Head, HeadReader
from ..models.loading import LoadedModel
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

    def run(
        self, ids: torch.Tensor, steered: Steering | None, through: int | None = None
    ) -> tuple[Held, torch.Tensor | None]:
        """The prompt `ids` (1 × positions) steered by `steered` (None: plain), through decoder layer `through`
        (None: all of them), from the cache or run and kept there."""
        tokens, steering = tuple(ids[0].tolist()), None if steered is None else (steered.how, float(steered.lam))
        for depth in dict.fromkeys((None, through)):
            hit = self.cache.get((tokens, steering, depth))
            if hit is not None:
                return hit
        with self._steering(steered):
            cache, last = prompt_forward(self.lm, ids, self.precision, through=through)
        held, logits = prompt_layers(cache), None if last is None else last[0]
        kept = [t for kv in held for t in kv] + ([logits] if logits is not None else [])
        self.cache.put((tokens, steering, through if logits is None else None), (held, logits), tensor_bytes(*kept))
        return held, logits

    def scored(self, ids: torch.Tensor, steered: Steering | None, top: int) -> tuple[Held, torch.Tensor, PromptScores]:
        """The prompt run as run() runs it, every position's logits kept, and its own tokens scored with `top`
        alternatives each; p(good) read on the plain prompt (a second, plain forward when the prompt is steered)."""
        reader = HeadReader(self.lm.model, self.head, 1, every=True)
        with self._steering(steered), nullcontext() if steered else reader:
            cache, logits = prompt_forward(self.lm, ids, self.precision, every_position=True)
        if steered is not None and self.head is not None:
            with reader:
                prompt_forward(self.lm, ids, self.precision)
        return prompt_layers(cache), logits[0, -1].float(), prompt_scores(ids[0], logits[0], top, reader.read())

    def _steering(self, steered: Steering | None):
        if steered is None:
            return nullcontext()
        lora = self._lora() if steered.how.spec.action.needs_lora else None
        return steer(self.lm.model, self.vectors, steered.lam, steered.how, lora)
