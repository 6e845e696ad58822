"""The benchmark's FLOP accounting, checked against torch's own FLOP counter (timings are not asserted here)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from topl_core.models.tiny import build_tiny_model
from topl_core.training.flops import layer_forward_flops, sweep_flops_ratio


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


def test_scale_bench_measures_every_part_on_a_cpu(tmp_path, tiny_records):
    """`bench --scale` end to end on a tiny model: every phase runs through the workbench's own code and reports
    figures that can be true (the GPU runs of the presets are in docs/bench/; here timings are not asserted)."""
    from topl_core.bench.scale import ScaleSettings, format_scale, run_scale_bench
    from topl_core.data.records import write_jsonl

    data = write_jsonl(tiny_records, tmp_path / "records.jsonl")
    settings = ScaleSettings("cpu", steps=2, micro_batch_size=2, new_tokens=6)
    res = run_scale_bench(["tiny-llama"], str(data), settings, log=lambda _: None)
    assert res["precision"] == "fp32" and res["matmul_peak_tflops"] > 0 and res["settings"]["steps"] == 2
    (row,) = res["rows"]
    for method, layers in (("topl", "0-3"), ("sft", "0-3")):
        t = row[f"train_{method}"]
        assert t["lora_layers"] == layers and len(t["losses"]) == 2
        assert 0 < t["mfu"] < 1 and 0 <= t["padding_share"] < 1 and t["peak_gib"] is None
    assert row["capture"]["sites"] == 4 * 7  # the SFT adapter: LoRA on every layer's 7 modules
    assert row["capture"]["tokens"] > 0
    steering = row["steering"]
    assert steering["lambdas"] == 17 and steering["same_texts"]  # fp32: the batched grid is the serial one
    # the compiled step (fp32 here) streams every λ's eager text
    assert steering["compiles"] and steering["compiled_same_texts"] == 17 and steering["compile_s"] > 0
    assert row["sweep"]["reuse_s"] > 0 and row["sweep"]["plain_s"] > 0
    assert "tiny-llama" in format_scale(res)
    trained_only = {k: v for k, v in row.items() if k not in ("capture", "steering", "sweep")}  # --skip's rows
    assert "capture" not in format_scale(res | {"rows": [trained_only]})
    assert ScaleSettings(skip=("fit", "sweep")).phases() == 4  # TOPL, SFT, capture, steering


def test_random_weight_presets_have_the_published_size():
    """A preset's random-weight build has the parameter count of the real model (counted on the meta device)."""
    from transformers import AutoModelForCausalLM

    from topl_core.models.loading import layer_count, preset_model_config, random_weights_preset

    assert random_weights_preset("qwen3-8b@random") == "qwen3-8b" and random_weights_preset("tiny-llama") is None
    assert layer_count("llama3.1-8b@random") == 32
    expected = {"qwen3-8b": 8.19e9, "llama3.1-8b": 8.03e9, "gemma3-4b": 3.88e9}  # Qwen3-8B: 8.19 B, Llama: 8.03 B
    for preset, n in expected.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(preset_model_config(preset))
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(n, rel=0.01)
