"""FLOPs of a training step, what MFU (model FLOPs utilisation) is counted against: the matmuls and causal attention
of the layers that run, forward and backward with respect to activations (the base weights are frozen; LoRA's own
FLOPs are under 1 % and left out). bench.py and scale_bench.py divide measured tokens/s by the matmul peak with them."""

from __future__ import annotations


def layer_forward_flops(config, seq_len: float) -> float:
    """Forward FLOPs per token of one decoder layer: its matmuls plus causal attention (half of 4·T·d)."""
    d, f = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * getattr(config, "head_dim", d // config.num_attention_heads)
    params_per_layer = d * d * 2 + d * kv * 2 + 3 * d * f  # q, o, k, v, gate, up, down
    return 2 * params_per_layer + 2 * seq_len * d


def topl_flops_per_token(config, layers_run: int, seq_len: float) -> float:
    return 2 * layers_run * layer_forward_flops(config, seq_len)  # forward + backward w.r.t. activations


def sft_flops_per_token(config, seq_len: float, predicted_share: float) -> float:
    """Every layer, plus the LM head at the predicted share of positions; forward + backward."""
    head = 2 * config.hidden_size * config.vocab_size * predicted_share
    return 2 * (config.num_hidden_layers * layer_forward_flops(config, seq_len) + head)


def sweep_flops_ratio(windows: list[tuple[int, int]]) -> float:
    """Training FLOPs per batch of a sweep with frozen-prefix reuse over without. A window (s, k) runs its k layers
    forward + backward (2 units each) either way; without reuse each window also runs the s frozen layers below it
    forward, with reuse the stored state is advanced once through max(s) layers for the whole grid."""
    window = sum(2 * k for _, k in windows)
    return (window + max(s for s, _ in windows)) / (window + sum(s for s, _ in windows))
