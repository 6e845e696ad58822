"""Frozen-prefix reuse for layer sweeps (docs/design.md §2, "Layer selection"; the why is in
analysis/studies/sweeps.py's docstring): a PrefixStore keeps, per batch, the residual stream entering some layer,
computed once by the frozen base layers and advanced upward; install_prefix_cache makes a window's model start its
forward there."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutputWithPast

from ..foundations.errors import ModelError
from ..models.architecture import base_causal_lm, decoder_stack, embed_inputs, forward_from_hidden
from ..models.loading import LoadedModel


@dataclass
class PrefixStats:
    batches_computed: int = 0  # prefix states built from the embeddings
    batches_advanced: int = 0  # states moved up from a lower layer
    batches_reused: int = 0  # states served as they were
    layer_passes: int = 0  # decoder-layer applications spent on prefixes (one per layer per batch)
    layer_passes_saved: int = 0  # decoder-layer applications a plain forward would have spent on them in addition


class PrefixStore:
    """Per batch (keyed by its token ids and mask), the residual stream entering some layer L, computed once with
    the frozen base layers 0..L−1 (no gradients) and advanced upward on demand. One state per batch is kept (the
    newest): windows should be visited in order of start."""

    def __init__(self) -> None:
        self._states: dict[str, tuple[int, torch.Tensor]] = {}
        self.stats = PrefixStats()

    @staticmethod
    def key(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> str:
        h = hashlib.sha1(str(tuple(input_ids.shape)).encode())
        h.update(input_ids.detach().cpu().numpy().tobytes())
        if attention_mask is not None:
            h.update(attention_mask.detach().cpu().numpy().astype(np.int8).tobytes())
        return h.hexdigest()

    def __len__(self) -> int:
        return len(self._states)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self._states.values())

    def clear(self) -> None:
        self._states.clear()

    @torch.no_grad()
    def entering(
        self, decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, start: int
    ) -> torch.Tensor:
        """The residual stream entering layer `start` for this batch."""
        if start == 0:
            return embed_inputs(decoder, input_ids)
        k = self.key(input_ids, attention_mask)
        level, h = self._states.get(k, (None, None))
        if level == start:
            self.stats.batches_reused += 1
            self.stats.layer_passes_saved += start
            return h
        if level is not None and level < start:
            self.stats.batches_advanced += 1
            self.stats.layer_passes_saved += level
        else:
            level, h = 0, embed_inputs(decoder, input_ids)
            self.stats.batches_computed += 1
        h = forward_from_hidden(decoder, h, attention_mask, level, start - 1)
        self.stats.layer_passes += start - level
        self._states[k] = (start, h.detach())
        return h


class PrefixCachedDecoder(torch.nn.Module):
    """A drop-in for a causal LM's decoder stack whose forward starts at layer `start` from a PrefixStore state.
    Holds the original embedding, layers, norm and rotary modules (shared, not copied)."""

    def __init__(self, decoder: torch.nn.Module, store: PrefixStore, start: int):
        super().__init__()
        self.config = decoder.config
        self.embed_tokens = decoder.embed_tokens
        self.layers = decoder.layers
        self.norm = decoder.norm
        self.rotary_emb = decoder.rotary_emb
        self.start = start
        self._store = store

    def get_input_embeddings(self):
        return self.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, use_cache=False, **kwargs):
        if input_ids is None:
            raise ModelError("PrefixCachedDecoder needs input_ids (its cache is keyed by them).")
        if kwargs.get("position_ids") is not None:
            raise ModelError(
                "prefix reuse keys its states by padded batches and cannot take packed ones; train the sweep's "
                "windows without packing, or with reuse_prefix=False."
            )
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        h = self._store.entering(self, input_ids, attention_mask, self.start)
        h = forward_from_hidden(self, h, attention_mask, self.start)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h))


def install_prefix_cache(lm: LoadedModel, store: PrefixStore, start: int) -> LoadedModel:
    """Make `lm` (a model this caller owns, e.g. freshly loaded for one window) start its forward at layer `start`
    from `store`. Only for training windows whose LoRA starts at `start`; the model cannot generate afterwards."""
    causal = base_causal_lm(lm.model)
    cfg = causal.config
    for name in ("attention_dropout", "hidden_dropout", "dropout"):
        if float(getattr(cfg, name, 0.0) or 0.0) > 0:
            raise ModelError(
                f"prefix reuse needs dropout-free base layers, but config.{name}={getattr(cfg, name)}; "
                "run the sweep with reuse_prefix=False."
            )
    causal.model = PrefixCachedDecoder(decoder_stack(causal), store, start)
    return lm
