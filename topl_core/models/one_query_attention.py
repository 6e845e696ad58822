"""A decode step's attention on a CPU: one query per row (each row's next token) against its keys, as grouped matrix
products in float32, where torch's CPU kernel is slow for one query. Every other call (a prompt's many queries, a GPU,
a setting the products do not cover) is the model's own attention. load_model gives every CPU model this attention, so
the page's streams, the CLI, `generate` and the service decode through the same one.

    name = one_query_attention("sdpa")      registered with transformers once: "topl_one_query_sdpa", sdpa's masks
    own_attention(name) -> "sdpa"           the attention it falls back to (what masks and checks are made for)
    registered_attention(name, implementation, wrap)   any such wrapper, registered once (models/forward.py's bf16)

Why (SmolLM2's shape: 9 query heads over 3 key heads of 64, 768 positions; 2-core Zen 4 EPYC, one layer): 8 rows took
3.1 ms through bf16 sdpa (a bf16 service step under autocast) and 2.15 ms through float32 sdpa in a compiled graph
(which repeats the keys for each query head), against 0.39 ms here (float32 operands); one row 0.54 ms in bf16
against 0.10.

The products read each key head once for the query heads sharing it (rows × key heads × group × positions), and the
scores, softmax and weighted values are float32 whatever the operands are (bf16 under autocast: what sdpa's CPU kernel
accumulates in), the output in the query's dtype, as sdpa's is.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

PREFIX = "topl_one_query_"
_UNCOVERED = ("softcap", "s_aux", "cache", "position_bias")  # settings the products do not cover: the model's own


def one_query_attention(implementation: str) -> str:
    """The name of `implementation` with one query's attention computed here (the module docstring), registered with
    transformers once, with `implementation`'s masks."""
    if implementation.startswith(PREFIX):
        return implementation

    def wrap(own):
        def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
            if _covered(query, key, value, attention_mask, dropout, kwargs):
                return _one_query(query, key, value, attention_mask, scaling), None
            return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

        return attend

    return registered_attention(PREFIX + implementation, implementation, wrap)


def registered_attention(name: str, implementation: str, wrap: Callable[[Callable], Callable]) -> str:
    """`name`, registered with transformers once as `wrap` of `implementation`'s attention function (the model's own
    where it is "eager"), with `implementation`'s masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name not in ALL_ATTENTION_FUNCTIONS:
        own = ALL_ATTENTION_FUNCTIONS[implementation] if implementation != "eager" else _model_eager_attention
        AttentionInterface.register(name, wrap(own))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


def own_attention(name: str) -> str:
    """The model's own attention behind `name` (itself where it is not one_query_attention's)."""
    return name.removeprefix(PREFIX)


def _covered(query, key, value, mask, dropout, kwargs) -> bool:
    """Whether the products compute this call: one query per row on a CPU, key heads dividing the query heads, a mask
    of one row per batch row (or none), no dropout and none of the settings they do not cover."""
    return (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and query.shape[1] % key.shape[1] == 0
        and key.shape[-1] == value.shape[-1] == query.shape[-1]
        and not dropout
        and (mask is None or (mask.dim() == 4 and mask.shape[1] == mask.shape[2] == 1))
        and not kwargs.get("output_attentions")
        and all(kwargs.get(k) is None for k in _UNCOVERED)
    )


def _one_query(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """rows × heads × 1 × size queries against rows × key heads × positions × size keys and values (a boolean mask:
    True attends; else additive) → rows × 1 × heads × size, as transformers' attention functions return it."""
    rows, heads, _, size = query.shape
    groups, positions = key.shape[1], key.shape[2]
    scale = size**-0.5 if scaling is None else scaling
    with torch.autocast("cpu", enabled=False):
        grouped = query.float().reshape(rows, groups, heads // groups, size)
        scores = torch.matmul(grouped, key.float().transpose(-1, -2)) * scale  # rows × key heads × group × positions
        if mask is not None:
            mask = mask[..., :positions]
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), value.float())
    return out.reshape(rows, heads, 1, size).transpose(1, 2).contiguous().to(query.dtype)


def _model_eager_attention(module: torch.nn.Module, *args, **kwargs):
    """The model's own eager attention (each architecture's modeling module has its own)."""
    return sys.modules[type(module).__module__].eager_attention_forward(module, *args, **kwargs)
