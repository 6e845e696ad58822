"""Applying steering: forward hooks through which a mode's action (actions.py) edits the steered sites' outputs.

with steer(model, vectors, lam, how=SteerConfig(), lora=None): ...
    lam: one λ for every batch row, or a sequence of λ, one per batch row (a λ grid generated as one batch:
    SteeringSession.generate_grid); a row steered with λ gets exactly what a batch steered with λ alone gets.
    forward hooks on the modules at the vectors' site paths (merged model, or the PEFT model) steer their
    outputs in every forward made *from the thread that entered the context* (other threads using the same model
    are untouched). The model is never modified; hooks are registered inside try and removed in finally. The
    mode's neutral λ reproduces the unsteered output exactly. Works with KV-cache generation (each cached step's
    new positions are steered just as a full recompute would steer them), and with positions="generated" leaves
    the prompt untouched. Any generation code runs steered inside the context, e.g.
    `with steer(lm.model, v, 2.0): generate(lm, documents, cfg)`.
    The context yields a SteeringSwitch: while its `on` is False the hooks leave every forward alone (a gated
    decoder, gate.py, turns the steering on for the forwards its head asks for).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch

from ...foundations.errors import ModelError
from ...models.architecture import base_causal_lm
from ..lora_a.sites import LoraWeights, Site, site_module
from .modes import SteerConfig
from .vectors import SteeringVectors

_HOOK_LOCK = threading.Lock()  # registering/removing hooks is serialised (hook dicts are shared by threads)


@dataclass
class SteeringSwitch:
    """What steer() yields: `on` says whether the forwards from here on are steered (True on entry)."""

    on: bool = True


def _is_prefill(kwargs: dict) -> bool:
    """Whether a causal-LM forward processes the prompt: no KV cache yet (a plain forward, or generate's first step).
    Later generate steps carry a cache holding the tokens before them."""
    past = kwargs.get("past_key_values")
    return past is None or past.get_seq_length() == 0


@contextmanager
def steer(
    model: torch.nn.Module,
    vectors: SteeringVectors,
    lam: float | Sequence[float],
    how: SteerConfig = SteerConfig(),
    lora: Mapping[Site, LoraWeights] | None = None,
) -> Iterator[SteeringSwitch]:
    """Steer forwards from this thread while active (module docstring): the mode's action (actions.py) edits the
    outputs of its sites of the MERGED model `model` — adding λ·delta at the vectors' sites, scaling the adapter's
    update by λ at every site of `lora` (default: read from vectors.adapter_path when the action needs it), ...
    A sequence `lam` steers batch row r with lam[r] (every forward's batch must then have len(lam) rows).

    Example: ``with steer(merged.model, vectors, 2.0): logits = merged.model(**inputs).logits``"""
    # one code path: λ per row as shape (rows, 1, 1) against outputs (rows, positions, features); a single λ is a
    # scalar that broadcasts to every row (and to any output shape)
    lams = torch.as_tensor(lam, dtype=torch.float64)
    if lams.ndim > 1 or lams.numel() == 0:
        raise ValueError(f"lam={lam!r}: give one λ or a non-empty sequence of λ, one per batch row.")
    rows = lams.numel()
    lams = lams.reshape(-1, 1, 1) if rows > 1 else lams.reshape(())
    owner = threading.get_ident()
    state = {"prefill": False}
    switch = SteeringSwitch()
    action = how.spec.action
    if action.needs_lora and lora is None:
        lora = vectors.adapter_lora()
    edits = action.edits(model, vectors, how.spec, how.units, lams, lora)

    def make_hook(key: str, edit):
        def hook(_module, inputs, output):
            if threading.get_ident() != owner or not switch.on or (how.positions == "generated" and state["prefill"]):
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
    try:
        with _HOOK_LOCK:
            if how.positions == "generated":
                handles.append(base_causal_lm(model).register_forward_pre_hook(prefill_hook, with_kwargs=True))
            for s, edit in edits.items():
                handles.append(site_module(model, s).register_forward_hook(make_hook(s.key, edit)))
        yield switch
    finally:
        with _HOOK_LOCK:
            for h in handles:
                h.remove()
