"""Forward passes shared by training, token scoring and analysis, and the one reader of a token-level head.

`head_features` runs the decoder only up to layer m (an early exit through a forward hook, so the shared model is
never modified) and applies the model's own final norm: H = FinalNorm(f_{0:m}(x)), the input of a TOPL head.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import torch
import torch.nn.functional as F

from ..hardware.linear_kernel import FewRowLinear, bf16_weight
from ..hardware.precision import full_precision
from .architecture import base_causal_lm, decoder_layers, final_norm
from .one_query_attention import registered_attention

T = TypeVar("T")


class _EarlyExit(Exception):
    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden


@contextmanager
def exit_after_layer(model: torch.nn.Module, layer: int) -> Iterator[None]:
    """While active, a forward pass stops after decoder layer `layer` by raising _EarlyExit with its output.
    The hook is removed on every exit path."""

    def hook(_module, _inputs, output):
        raise _EarlyExit(output[0] if isinstance(output, tuple) else output)

    handle = decoder_layers(model)[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def hidden_after_layer(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer: int,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Residual stream output of decoder layer `layer` (0-based), without running the layers after it. A packed
    batch passes its position_ids and no attention_mask (topl_core.data.encode.Batch.forward_inputs)."""
    inner = base_causal_lm(model).model
    with exit_after_layer(model, layer):
        try:
            inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        except _EarlyExit as stop:
            return stop.hidden
    raise RuntimeError(f"decoder layer {layer} never ran: the model has {len(decoder_layers(model))} layers")


def through_layer(model: torch.nn.Module, layer: int | None, forward: Callable[[], T]) -> T | None:
    """forward() (a forward of `model`) run whole when `layer` is None, else stopped after decoder layer `layer`:
    None then, and what it wrote on the way (a KV cache's layers up to `layer`) is what it gave."""
    if layer is None:
        return forward()
    with exit_after_layer(model, layer):
        try:
            return forward()
        except _EarlyExit:
            return None


# a decoder layer's per-row inputs besides its hidden states (a row's mask, position and rotary embeddings)
_ROW_INPUTS = ("hidden_states", "attention_mask", "position_ids", "position_embeddings")


def first_rows_above(model: torch.nn.Module, layer: int, rows: int) -> list[torch.utils.hooks.RemovableHandle]:
    """Decoder layers above `layer` run the batch's first `rows` rows only (pre-hooks on them, returned): the other
    rows' states stop at `layer`, and the final norm and LM head see `rows` rows. A KV cache's update writes the rows
    it is given, so the others' upper layers are left as they were (a batched step's rows read only at `layer`)."""

    def first(value):
        if isinstance(value, tuple):
            return tuple(first(v) for v in value)
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] > rows:
            return value[:rows]
        return value  # one row broadcast to all (a mask of one row), or no tensor

    def keep_first(_module, args, kwargs):
        return tuple(first(a) for a in args), {k: first(v) if k in _ROW_INPUTS else v for k, v in kwargs.items()}

    return [
        decoder_layers(model)[i].register_forward_pre_hook(keep_first, with_kwargs=True)
        for i in range(layer + 1, len(decoder_layers(model)))
    ]


def bf16_step_tree(tree: torch.nn.Module) -> None:
    """A private module tree (inference/compiled_decode.private_tree) made a bf16 decode step's, in place: what bf16
    autocast computes, written out for a graph traced without it. Each FewRowLinear holds its weight's kept bf16 copy
    (hardware/linear_kernel.bf16_weight: the tensors eager bf16 decoding uses; a LM head tied to the embedding is
    untied here, the embedding staying float32 as under autocast), so a compiled graph reads half the bytes and rounds
    its linears as autocast does (linear_kernel.rows_product_bf16); attention is the model's own over bf16-rounded
    queries, keys and values (bf16_attention). Norms, rotary embeddings and the residual stream stay float32, as under
    autocast."""
    for module in tree.modules():
        if isinstance(module, FewRowLinear) and module.weight.dtype == torch.float32:
            module.weight = torch.nn.Parameter(bf16_weight(module.weight), requires_grad=False)
    tree.config._attn_implementation = bf16_attention(tree.config._attn_implementation)


def bf16_attention(implementation: str) -> str:
    """The name of `implementation`'s attention as bf16 autocast gives its operands — queries, keys and values rounded
    to bf16, the output too — with its sums in float32 (what a bf16 kernel accumulates in: the same figures but for
    their order), registered with transformers once, with the same masks. torch's bf16 attention itself made
    SmolLM2's compiled two-row step 28–30 ms against 16–18 (docs/performance.md, "The decode step's linears")."""

    def wrap(attend):
        def bf16(module, query, key, value, mask, **kwargs):
            rounded = (t.to(torch.bfloat16).float() for t in (query, key, value))
            out, weights = attend(module, *rounded, mask, **kwargs)
            return out.to(torch.bfloat16), weights

        return bf16

    return registered_attention(f"topl_bf16_{implementation}", implementation, wrap)


def head_features(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer: int,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """H = FinalNorm(hidden after layer m): what the TOPL/SOPL/TLDR head reads. Shape (B, T, d)."""
    return final_norm(model)(hidden_after_layer(model, input_ids, attention_mask, layer, position_ids))


def head_probability(head: torch.nn.Linear, features: torch.Tensor) -> torch.Tensor:
    """p(good) = σ(head(H)) per token, (B, T, d) → (B, T), in float32 outside autocast: a bf16 head logit carries 8
    mantissa bits, so near-equal tokens would tie and the detection AUROC would move with the precision."""
    bias = None if head.bias is None else head.bias.float()
    with full_precision(features.device.type):
        return torch.sigmoid(F.linear(features.float(), head.weight.float(), bias).squeeze(-1))


@dataclass(frozen=True)
class Head:
    """A token-level head: p(good) = σ(linear(FinalNorm(hidden state after decoder layer `layer`))) — a TOPL run's
    head.safetensors, or a probe head fitted on an adapter's hidden states (analysis/lora_a/probe_head.py)."""

    layer: int
    linear: torch.nn.Linear

    def read(self, model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """p(good) of `hidden` ((B, T, d), the states after `layer` of `model`): the model's final norm, then the
        head, in float32 (head_probability) → (B, T)."""
        return head_probability(self.linear, final_norm(model)(hidden))


class HeadReader:
    """The head read inside forwards the model runs anyway: while active (a context manager; its hook removed on
    every exit), every forward from the thread that entered it reads p(good) after the head's layer, through the
    model's final norm, in the forward's autocast — each row's last position (rows), or with `every` every position
    (rows × positions). read() gives the last forward's reading (NaN per row without a head, or before any forward);
    take() gives it once (LookupError if no forward read it since)."""

    def __init__(self, model: torch.nn.Module, head: Head | None, rows: int = 1, every: bool = False):
        self._model, self._head, self._rows, self._every = model, head, rows, every
        self._seen: dict[str, torch.Tensor] = {}
        self._handle = None

    def read(self) -> torch.Tensor:
        return self._seen.get("p", torch.full((self._rows,), float("nan")))

    def take(self) -> torch.Tensor:
        try:
            return self._seen.pop("p")
        except KeyError:
            raise LookupError("no forward read the head since the last reading") from None

    def __enter__(self) -> "HeadReader":
        if self._head is not None:
            model, head, owner, every = self._model, self._head, threading.get_ident(), self._every

            def read_head(_module, _inputs, output):
                if threading.get_ident() == owner:
                    hidden = output[0] if isinstance(output, tuple) else output
                    p = head.read(model, hidden if every else hidden[:, -1:])
                    self._seen["p"] = p if every else p[:, -1]

            self._handle = decoder_layers(self._model)[head.layer].register_forward_hook(read_head)
        return self

    def __exit__(self, *exc) -> bool:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return False


def lm_head_logits(lm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The causal LM's output head on `hidden` (N, d) → (N, vocab) float32 logits: computed in float32 outside
    autocast (bf16 logits would quantise log-probs to ~0.1 nats), then the model's final logit soft-cap when its
    config has one (Gemma), as in the model's own forward. `lm` is the base causal LM (models.base_causal_lm)."""
    head = lm.get_output_embeddings()
    with full_precision(hidden.device.type):
        logits = F.linear(hidden.float(), head.weight.float(), None if head.bias is None else head.bias.float())
    cap = getattr(lm.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def next_token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """log p(x_t | x_<t), aligned so that result[:, t] scores input_ids[:, t]; result[:, 0] = 0. Computed from
    logits in float32. With `positions` (bool (B, T)), the LM head runs only where needed (the vocabulary
    projection dominates a small model's forward) and other entries are 0."""
    if positions is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        return F.pad(lp, (1, 0))
    lm = base_causal_lm(model)
    hidden = lm.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    want = positions.clone()
    want[:, 0] = False  # the first token has no prediction
    rows, cols = want.nonzero(as_tuple=True)
    logits = lm_head_logits(lm, hidden[rows, cols - 1])
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    out[rows, cols] = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[rows, cols, None]).squeeze(-1)
    return out
