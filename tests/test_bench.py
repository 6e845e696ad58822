"""The benchmark's FLOP accounting, checked against torch's own FLOP counter (timings are not asserted here)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from topl_core.bench import layer_forward_flops, sweep_flops_ratio
from topl_core.tiny_models import build_tiny_model


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-qwen3"])
def test_layer_matmul_flops_match_torch_flop_counter(family):
    model, _ = build_tiny_model(family)
    cfg, T = model.config, 37
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.model(input_ids=torch.randint(5, 300, (1, T)))  # the decoder stack, no LM head
    matmuls = counter.get_total_flops()  # projections only (the counter does not see this attention kernel)
    attention = 2 * T * cfg.hidden_size  # our causal-attention term per token per layer
    assert cfg.num_hidden_layers * T * (layer_forward_flops(cfg, T) - attention) == matmuls


def test_sweep_flops_ratio_counts_the_skipped_prefix():
    assert sweep_flops_ratio([(0, 3), (0, 6)]) == 1.0  # nothing below layer 0 to skip
    assert sweep_flops_ratio([(6, 3)]) == 1.0  # one window: its prefix is computed once either way
    # two windows at start 6: the prefix once (6) instead of twice (12), besides 2·(3 + 6) window units
    assert sweep_flops_ratio([(6, 3), (6, 6)]) == pytest.approx((18 + 6) / (18 + 12))
