"""The batcher's KV cache layer (batch.py): one decoder layer's keys and values of every slot in one storage."""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import DynamicLayer


class SlotLayer(DynamicLayer):
    """One decoder layer's keys and values of every slot (the module docstring): update() writes each row's new
    position at its slot's own index and gives back the first `length` positions of every row."""

    def __init__(self, batcher: object):  # the Batcher: its write_at_step and length, read at each update
        super().__init__()
        self._batcher = weakref.proxy(batcher)
        self.keys = self.values = None
        self.is_initialized = True

    def allocate(self, like: torch.Tensor, slots: int, capacity: int, dtype: torch.dtype | None = None) -> None:
        """Storage for `slots` rows of `capacity` positions shaped as `like` (1 × heads × positions × head size), in
        `dtype` (None: like's), keeping what the old storage held."""
        _, heads, _, size = like.shape
        old = (self.keys, self.values)
        self.keys = like.new_zeros(slots, heads, capacity, size, dtype=dtype)
        self.values = like.new_zeros(slots, heads, capacity, size, dtype=dtype)
        if old[0] is not None:
            held = old[0].shape[2]
            self.keys[:, :, :held], self.values[:, :, :held] = old

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        b = self._batcher
        rows = key_states.shape[0]
        each, at = torch.arange(rows, device=key_states.device), b.write_at_step[:rows]
        self.keys[each, :, at] = key_states[:, :, 0].to(self.keys.dtype)
        self.values[each, :, at] = value_states[:, :, 0].to(self.values.dtype)
        return self.keys[:rows, :, : b.length], self.values[:rows, :, : b.length]

    def get_seq_length(self) -> int:
        return self._batcher.length - 1  # the query sits at the last position: every position before it is seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._batcher.length, 0
