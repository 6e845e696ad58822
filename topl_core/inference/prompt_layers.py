"""A prompt run again from the first layer a steering edits: the decoder layers below it compute the plain prompt's
forward whatever the λ, so a prompt steered again (the slider's next position with every position steered, a served
request's steered prompt after its twin's plain one) takes their keys and values and the hidden state leaving them
from a forward of the same prompt that kept them, and runs the layers from there up. SmolLM2's demo vector steers
layers 16–19: 16 of its 30 layers are not run again.

    with plain_below(model, layer): ...     forwards from this thread compute the plain prompt below decoder layer
                                            `layer` (runtime/hooks.edit_outputs declares its lowest edited layer so;
                                            a plain forward may declare any layer, to keep its layers below it)
    plain_below_layer(model) -> int | None  that layer, while declared on this thread (nested: the lowest)
    with resumed_prompt(model, ids, precision, cache, through, first_row) as forward_done: ...   inside: the prompt
        forward of `ids` into `cache`; below the declared layer, the layers a forward of the same model (its weights
        unchanged there), prompt and precision kept are taken (their keys and values put in `cache` by
        forward_done()), else they run and are kept for the next (the KEPT most recent prompts). Rows of one prompt
        (a λ grid, a λ per row) take one row's layers, which first_row(layer) runs first where none is kept
    last_resumed() -> int                   the layers this thread's last prompt forward took so (0: none)

Bit for bit the whole forward (tested): the layers below take exactly the inputs they took before, and the layers
from the declared one up take the hidden state those gave. A grid's rows take the one row's layers below as a stream of
that prompt computes them (a batch of rows may round the last bits otherwise: the grid's texts are a stream's up to
those bits, as before), and its layers below run once instead of once per row. Only for rows of one prompt and a plain
prompt cache (no sliding-window layers); anything else runs whole.

How a layer is skipped without changing the shared model: hooks acting on this thread only run each layer below on
its last position alone (its keys and values then replaced by the kept forward's) and give the hidden state kept.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from transformers.cache_utils import DynamicLayer

from ..models.architecture import decoder_layers
from .prompt_cache import PromptCache, tensor_bytes

KEPT = 8  # prompts whose layers below are kept (the page's documents, the service's recent prompts)
KEPT_BYTES = 512 * 2**20  # and at most this much of them
_declared = threading.local()  # this thread's `layers` {id(model): layer} and `resumed` (last_resumed)


@contextmanager
def plain_below(model: torch.nn.Module, layer: int) -> Iterator[None]:
    """Declare that forwards from this thread compute `model`'s plain prompt below decoder layer `layer` while
    inside (nested: the lowest counts)."""
    edited = _declared.__dict__.setdefault("layers", {})
    before = edited.get(id(model))
    edited[id(model)] = layer if before is None else min(before, layer)
    try:
        yield
    finally:
        if before is None:
            edited.pop(id(model), None)
        else:
            edited[id(model)] = before


def plain_below_layer(model: torch.nn.Module) -> int | None:
    """The layer declared for `model` on this thread (plain_below), else None."""
    return getattr(_declared, "layers", {}).get(id(model))


def last_resumed() -> int:
    """The layers this thread's last prompt forward took from a kept one (0: it ran them all)."""
    return getattr(_declared, "resumed", 0)


@dataclass
class Below:
    """The layers below the declared one (part of its key) of one prompt's forward: each layer's keys and values, the
    hidden state leaving them."""

    model: weakref.ref
    keys_values: list[tuple[torch.Tensor, torch.Tensor]]
    entering: torch.Tensor


_KEPT: PromptCache[Below] = PromptCache(max_bytes=KEPT_BYTES, max_entries=KEPT)


def _key(model: torch.nn.Module, ids: torch.Tensor, precision: str, layer: int) -> tuple:
    """What the layers below depend on: the model (and its weights' versions there), the prompt, the precision."""
    below = decoder_layers(model)[:layer]
    versions = tuple(p._version for block in below for p in block.parameters() if not p.is_inference())
    digest = hashlib.sha256(ids.cpu().numpy().tobytes()).hexdigest()
    return id(model), digest, tuple(ids.shape), precision, layer, versions


@contextmanager
def resumed_prompt(
    model: torch.nn.Module,
    ids: torch.Tensor,
    precision: str,
    cache,
    through: int | None = None,
    first_row: Callable[[int], None] | None = None,
) -> Iterator[Callable[[], None]]:
    """The prompt forward made inside (stopped after layer `through`, if given) resumes below the declared layer where
    it can (the module docstring). `first_row(layer)`: runs the first row of `ids` alone through layer - 1 (a prompt
    forward from this thread, which keeps its layers below), for rows of one prompt none of whose layers are kept."""
    _declared.resumed = 0
    layer = plain_below_layer(model)
    layers = decoder_layers(model)
    plain = all(type(kind) is DynamicLayer for kind in getattr(cache, "layers", [None]))
    deep = through is None or through >= layer - 1 if layer else False
    rows = ids.shape[0]
    if not layer or not deep or not plain or layer >= len(layers) or not _one_prompt(ids, first_row):
        yield lambda: None
        return
    key = _key(model, ids[:1], precision, layer)
    kept = _KEPT.get(key)
    if kept is None and rows > 1:  # a grid's rows: their one row's layers below run first, kept by that forward
        first_row(layer)
        kept = _KEPT.get(key)
    if kept is not None and (kept.model() is not model or (through is not None and through < layer)):
        kept = None
    owner, handles, leaving = threading.get_ident(), [], []

    def last_position(_module, args, kwargs):
        if threading.get_ident() != owner:
            return None
        return tuple(_last_position(a) for a in args), {k: _last_position(v, k) for k, v in kwargs.items()}

    def kept_hidden(_module, _inputs, output):
        if threading.get_ident() != owner:
            return None
        entering = _for_rows(kept.entering, rows)
        return (entering, *output[1:]) if isinstance(output, tuple) else entering

    def keep_hidden(_module, _inputs, output):
        if threading.get_ident() == owner:
            leaving.append(output[0] if isinstance(output, tuple) else output)

    if kept is not None:
        handles += [layers[i].register_forward_pre_hook(last_position, with_kwargs=True) for i in range(layer)]
        handles.append(layers[layer - 1].register_forward_hook(kept_hidden))
    elif rows == 1:  # a batch's own layers below are never kept: a stream taking them would round as the batch did
        handles.append(layers[layer - 1].register_forward_hook(keep_hidden))

    def done() -> None:
        if kept is not None:
            for i, (keys, values) in enumerate(kept.keys_values):
                cache.layers[i].keys, cache.layers[i].values = _for_rows(keys, rows), _for_rows(values, rows)
            _declared.resumed = layer
        elif leaving:
            below = [(cache.layers[i].keys, cache.layers[i].values) for i in range(layer)]
            nbytes = tensor_bytes(leaving[0], *(t for kv in below for t in kv))
            _KEPT.put(key, Below(weakref.ref(model), below, leaving[0]), nbytes)

    try:
        yield done
    finally:
        for h in handles:
            h.remove()


def _one_prompt(ids: torch.Tensor, first_row: Callable[[int], None] | None) -> bool:
    """Whether `ids` is one row, or rows of one prompt that first_row can run once."""
    return ids.shape[0] == 1 or (first_row is not None and bool((ids == ids[:1]).all()))


def _for_rows(kept: torch.Tensor, rows: int) -> torch.Tensor:
    """A kept one-row tensor for `rows` rows of its prompt (one row: itself, not copied)."""
    return kept if rows == 1 else kept.repeat(rows, *(1,) * (kept.dim() - 1))


# a decoder layer's inputs laid out positions-second (rows × positions × …), and its 4-D attention mask
_POSITIONS_SECOND = ("hidden_states", "position_ids", "position_embeddings")


def _last_position(value, name: str = "hidden_states"):
    """`value` (a decoder layer's input) cut to its last position alone (a layer's reshapes refuse none): the layer
    attends to that position only, its keys and values replaced after."""
    if isinstance(value, tuple):
        return tuple(_last_position(v, name) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if name == "attention_mask" and value.dim() == 4:
        return value[:, :, -1:, -1:]
    if name in _POSITIONS_SECOND and value.dim() >= 2:
        return value[:, -1:]
    return value
