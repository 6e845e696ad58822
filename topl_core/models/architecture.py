"""Architecture access for Llama / Qwen3 / Gemma3-style causal LMs (PEFT-wrapped or not): the decoder layers, the
decoder stack and its final norm, the base *ForCausalLM, and a forward from an intermediate hidden state (the same
position ids, rotary embeddings and causal / sliding-window masks as the model's own forward)."""

from __future__ import annotations

import inspect

import torch

from ..foundations.errors import ModelError

# peft and transformers are imported inside the functions that use them: TrainConfig's validation reads the
# training methods' registry, which builds on this module, and importing a config need not wait for them


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layer list of a Llama/Qwen3/Gemma3-style causal LM (PEFT-wrapped or not)."""
    inner = base_causal_lm(model)
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise ModelError(
            f"Unsupported architecture {type(inner).__name__}: expected `model.model.layers` (Llama, Qwen3, Gemma3 "
            "families)."
        )
    return layers


# The decoder layers share one code object, so torch's recompile limit (8 by default) counts the graphs of every layer
# together: grad on or off (training, validation), an input that needs grad or not (the first LoRA layer and after), a
# micro-batch of one row (specialised), a layer with LoRA or without. Past the limit a new variant runs eagerly, with
# a warning only; Llama-3.1-8B training TOPL then SFT in one process reached it on an H200.
LAYER_RECOMPILE_LIMIT = 64


def compile_layers(model: torch.nn.Module, backend: str) -> None:
    """Compile each decoder layer's forward with `backend` (dynamic shapes), or with "" give each layer back its
    class's eager forward. The forward alone: the hooks around it (early exit, probes, capture) stay eager."""
    if backend:
        import torch._dynamo

        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, LAYER_RECOMPILE_LIMIT)
    for layer in decoder_layers(model):
        layer.__dict__.pop("forward", None)
        if backend:
            layer.forward = torch.compile(layer.forward, backend=backend, dynamic=True)


def base_causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """Unwrap a PeftModel to the underlying *ForCausalLM."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


def check_layer_range(num_layers: int, start: int, end: int) -> None:
    if not (0 <= start <= end < num_layers):
        raise ModelError(
            f"LoRA layer range [{start}, {end}] is outside the model's layers 0..{num_layers - 1}: "
            f"choose 0 <= layer_start <= layer_end <= {num_layers - 1}."
        )


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    return base_causal_lm(model).model.norm


def decoder_stack(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (LlamaModel / Qwen3Model / Gemma3TextModel, or a PrefixCachedDecoder) of a causal LM."""
    if hasattr(model, "layers") and hasattr(model, "rotary_emb"):
        return model
    inner = getattr(base_causal_lm(model), "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        raise ModelError(
            f"forward_from_hidden supports Llama/Qwen3/Gemma3-style models (model.model.layers + rotary_emb); "
            f"got {type(base_causal_lm(model)).__name__}."
        )
    return inner


def embed_inputs(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The residual stream entering layer 0 (Gemma's embedding module applies its own √d scale)."""
    return decoder_stack(model).embed_tokens(input_ids)


def _layer_types(config, n: int) -> list[str]:
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * n


def _masks_and_positions(decoder, hidden: torch.Tensor, attention_mask: torch.Tensor | None, types: set[str]):
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    config = decoder.config
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelError("forward_from_hidden: bidirectional-attention configs are not supported (causal LMs only).")
    position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    kw = dict(
        config=config,
        inputs_embeds=hidden,
        attention_mask=attention_mask,
        past_key_values=None,
        position_ids=position_ids,
    )
    masks = {}
    for t in types:
        if t == "full_attention":
            masks[t] = create_causal_mask(**kw)
        elif t == "sliding_attention":
            masks[t] = create_sliding_window_causal_mask(**kw)
        else:
            raise ModelError(f"forward_from_hidden: unknown layer type {t!r} in config.layer_types.")
    rotary = decoder.rotary_emb
    if "layer_type" in inspect.signature(rotary.forward).parameters:  # Gemma3: local and global rope per type
        pos_emb = {t: rotary(hidden, position_ids, t) for t in types}
    else:
        shared = rotary(hidden, position_ids)
        pos_emb = {t: shared for t in types}
    return position_ids, masks, pos_emb


def forward_from_hidden(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    attention_mask: torch.Tensor | None,
    start: int,
    end: int | None = None,
) -> torch.Tensor:
    """Run decoder layers start..end (inclusive) on `hidden`, the residual stream entering layer `start`.
    Equals output_hidden_states[end + 1] of the full forward (hidden_states[0] is the embedding output)."""
    decoder = decoder_stack(model)
    n = len(decoder.layers)
    end = n - 1 if end is None else end
    if not 0 <= start <= end < n:
        raise ModelError(f"forward_from_hidden: layers {start}..{end} are outside 0..{n - 1}.")
    types = _layer_types(decoder.config, n)
    position_ids, masks, pos_emb = _masks_and_positions(
        decoder, hidden, attention_mask, {types[i] for i in range(start, end + 1)}
    )
    h = hidden
    for i in range(start, end + 1):
        out = decoder.layers[i](
            h, attention_mask=masks[types[i]], position_embeddings=pos_emb[types[i]], position_ids=position_ids
        )
        h = out[0] if isinstance(out, tuple) else out
    return h
