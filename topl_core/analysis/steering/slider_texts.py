"""What the λ slider (slider.py) keeps and reads next: the finished texts in an LRU store shared by every view and
reader, and the slider positions a move reads next.

    TextStore(size=STORE_SIZE)                 .get(key), .put(key, text, replace=True): finished texts by key
    neighbours(positions, lam) -> [λ]          the slider positions either side of the one nearest `lam`
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable, Sequence

from ...runtime.steered_text import SteeredText

STORE_SIZE = 4096  # texts kept (short summaries: a few hundred bytes each)


def neighbours(positions: Sequence[float], lam: float) -> list[float]:
    """The slider positions either side of the one nearest `lam` (what its next move reads), rounded as keys are."""
    if not positions:
        return []
    at = min(range(len(positions)), key=lambda i: abs(positions[i] - lam))
    return [round(float(positions[i]), 6) for i in (at - 1, at + 1) if 0 <= i < len(positions)]


class TextStore:
    """Finished texts by what they depend on, shared by every reader (the least recently used dropped past `size`):
    a λ already written is drawn at once, and a generation a reader left is not kept half."""

    def __init__(self, size: int = STORE_SIZE):
        self._texts: OrderedDict[Hashable, SteeredText] = OrderedDict()
        self._lock, self._size = threading.Lock(), size

    def get(self, key: Hashable) -> SteeredText | None:
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
            return self._texts.get(key)

    def put(self, key: Hashable, text: SteeredText, replace: bool = True) -> None:
        """Keep `text` under `key`; replace=False: a text already kept stays (a text a reader has seen)."""
        with self._lock:
            if replace or key not in self._texts:
                self._texts[key] = text
            self._texts.move_to_end(key)
            while len(self._texts) > self._size:
                self._texts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._texts)
