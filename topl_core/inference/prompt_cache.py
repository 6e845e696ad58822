"""The prompt cache: the forwards of the most recently used prompts (their KV cache and last logits), so that a prompt
asked for again starts decoding at once instead of running again — the Steering page's session (a document it shows
again at another λ) and the service (a client asking about the same document again) keep theirs here.

    cache = PromptCache(max_bytes=512 * 2**20)       or PromptCache(max_entries=4)
    hit = cache.get(key)                             None on a miss; a hit becomes the most recently used
    cache.put(key, value, nbytes)                    the least recently used go while the cache is over its limits

The key names everything the forward depends on, and only that: the caller's model, the prompt's token ids (or its
document and task), the precision — and the prompt's steering where the mode steers the prompt, so that a steered
prompt never reads an unsteered prompt's entry nor the other way round (a cache keyed by the tokens alone would answer
a steered request with a plain request's forward, as llama-server's prompt cache once did with control vectors). A
mode that leaves the prompt unsteered shares the unsteered entry, as its prompt forward is that one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Hashable, TypeVar

import torch

V = TypeVar("V")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class PromptCache(Generic[V]):
    """Least-recently-used entries within `max_bytes` (the sizes given to put) and `max_entries`; thread-safe."""

    def __init__(self, max_bytes: int | None = None, max_entries: int | None = None):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return entry[0]

    def put(self, key: Hashable, value: V, nbytes: int = 0) -> None:
        """Keep `value` (unless it alone is over max_bytes), dropping the least recently used past the limits."""
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes -= old[1] if old is not None else 0
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while self._entries and (
                (self.max_bytes is not None and self._bytes > self.max_bytes)
                or (self.max_entries is not None and len(self._entries) > self.max_entries)
            ):
                _, (_, size) = self._entries.popitem(last=False)
                self._bytes -= size

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
