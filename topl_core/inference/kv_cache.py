"""A KV cache that decodes without copying itself: transformers' DynamicLayer concatenates every new token onto the
whole cache (torch.cat), so a decode step copies every layer's keys and values once (what that costs SmolLM2 after a
long prompt: docs/performance.md, "Figures behind the code's choices"). with_room() copies a prompt's cache once into
storage with room for the new tokens, and each step writes its position in place; attention reads the filled positions,
as before."""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of the first positions of larger storage: update() writes the
    new positions in place (new storage is allocated if they do not fit) and crop() moves the end back (the gated
    decoder takes tokens back). Made by with_room; a decode loop calls nothing else."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._length = keys.shape[-2]
        self._keys, self._values = self._storage(keys, room), self._storage(values, room)
        self._views()

    def _storage(self, filled: torch.Tensor, room: int) -> torch.Tensor:
        *lead, length, width = filled.shape
        storage = filled.new_empty(*lead, length + room, width)
        storage[..., :length, :] = filled
        return storage

    def _views(self) -> None:
        self.keys, self.values = self._keys[..., : self._length, :], self._values[..., : self._length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, end = self._length, self._length + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # out of room
            self._keys, self._values = self._storage(self.keys, end), self._storage(self.values, end)
        self._keys[..., start:end, :] = key_states
        self._values[..., start:end, :] = value_states
        self._length = end
        self._views()
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove positions (DynamicLayer's form: a negative count)."""
        if tokens_to_remove > 0:
            super().crop(tokens_to_remove)  # raises, as DynamicLayer does
        self._length += tokens_to_remove
        self._views()


def with_room(cache: DynamicCache, room: int, rows: int = 1) -> DynamicCache:
    """A copy of `cache` (a DynamicCache of one row, e.g. a prompt's) in `rows` identical rows whose plain layers have
    room for `room` more positions; other layers (sliding windows drop old positions) are deep copies, repeated. The
    original is left as it was, so one prompt's cache serves any number of generations."""
    roomy = copy.copy(cache)
    roomy.layers = []
    for layer in cache.layers:
        if type(layer) is DynamicLayer and layer.is_initialized:
            keys, values = (t.repeat_interleave(rows, dim=0) if rows > 1 else t for t in (layer.keys, layer.values))
            roomy.layers.append(RoomyLayer(keys, values, room))
        else:
            layer = copy.deepcopy(layer)
            if rows > 1:
                layer.batch_repeat_interleave(rows)
            roomy.layers.append(layer)
    return roomy
