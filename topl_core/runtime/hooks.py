"""Editing site outputs: the forward hooks through which a steering action's edits (actions.py) act. Generic: a
site's edit is a function of the module's input and output, whatever the action.

with edit_outputs(model, edits, rows=1, skip_prompt=False) as switch: ...
    forward hooks on the modules of `edits` ({Site: SiteEdit}) replace their outputs by edit(input, output) in every
    forward made *from the thread that entered the context* (other threads using the same model are untouched). The
    model is never modified; hooks are registered inside try and removed in finally. `rows` > 1: every forward's batch
    must have that many rows (one λ per row); `skip_prompt`: a forward over the prompt (no KV cache yet) is left alone,
    so only generated positions are edited. The context yields a SteeringSwitch: while its `on` is False the hooks
    leave every forward alone (the gated mode's judge, gate.py, turns the edits on for the forwards it asks for).

modes.steer builds a mode's edits and enters this context: that is the public form.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch

from ..foundations.errors import ModelError
from ..inference.prompt_layers import plain_below
from ..models.architecture import base_causal_lm, decoder_layers
from .sites import Site, site_module

_HOOK_LOCK = threading.Lock()  # registering/removing hooks is serialised (hook dicts are shared by threads)

# (module input, module output) -> the edited output, or None to leave the output as it is
SiteEdit = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | None"]


@dataclass
class SteeringSwitch:
    """What edit_outputs() yields: `on` says whether the forwards from here on are edited (True on entry)."""

    on: bool = True


def _is_prefill(kwargs: dict) -> bool:
    """Whether a causal-LM forward processes the prompt: no KV cache yet (a plain forward, or generate's first step).
    Later generate steps carry a cache holding the tokens before them."""
    past = kwargs.get("past_key_values")
    return past is None or past.get_seq_length() == 0


@contextmanager
def edit_outputs(
    model: torch.nn.Module, edits: Mapping[Site, SiteEdit], rows: int = 1, skip_prompt: bool = False
) -> Iterator[SteeringSwitch]:
    """Edit the outputs of the sites of `edits` in forwards from this thread while active (the module docstring)."""
    owner = threading.get_ident()
    state = {"prefill": False}
    switch = SteeringSwitch()

    def make_hook(key: str, edit: SiteEdit):
        def hook(_module, inputs, output):
            if threading.get_ident() != owner or not switch.on or (skip_prompt and state["prefill"]):
                return None
            if rows > 1 and output.shape[0] != rows:
                raise ModelError(
                    f"steer() was given {rows} λ values (one per batch row) but {key} got a batch of "
                    f"{output.shape[0]} rows; generate exactly one row per λ (SteeringSession.generate_grid)."
                )
            return edit(inputs[0], output)

        return hook

    def prefill_hook(_module, _args, kwargs):
        if threading.get_ident() == owner:
            state["prefill"] = _is_prefill(kwargs)
        return None

    handles = []
    # a prompt edited from its first edited layer up is run from there at the next λ (inference/prompt_layers.py)
    declared = nullcontext() if skip_prompt or not edits else plain_below(model, first_layer(model, edits))
    try:
        with _HOOK_LOCK:
            if skip_prompt:
                handles.append(base_causal_lm(model).register_forward_pre_hook(prefill_hook, with_kwargs=True))
            for s, edit in edits.items():
                handles.append(site_module(model, s).register_forward_hook(make_hook(s.key, edit)))
        with declared:
            yield switch
    finally:
        with _HOOK_LOCK:
            for h in handles:
                h.remove()


def first_layer(model: torch.nn.Module, sites) -> int:
    """The first decoder layer holding one of `sites`' modules (0 where one is outside every layer): each site's path
    walked from the top until it meets a decoder layer (a few lookups: edit_outputs is entered at every eager step of
    the service's batcher)."""
    index = {id(layer): i for i, layer in enumerate(decoder_layers(model))}
    inner = base_causal_lm(model)

    def layer_of(path: str) -> int:
        parts = path.split(".")
        for depth in range(1, len(parts) + 1):
            i = index.get(id(inner.get_submodule(".".join(parts[:depth]))))
            if i is not None:
                return i
        return 0

    return min(layer_of(s.path) for s in sites)
