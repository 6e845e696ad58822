"""Training memory computed on the meta device (topl_core.training.memory): the count equals the one on real tensors,
the estimate meets the peaks measured on an H100, and what does not fit is refused with the fixes named."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.errors import ConfigError
from topl_core.foundations.paths import DEFAULT_DATA, PROJECT_ROOT, cache_dir, project_path
from topl_core.models.loading import preset_model_config
from topl_core.models.tiny import build_tiny_model
from topl_core.training.batching import EncodeSettings, batch_for, length_buckets
from topl_core.training.config import TrainConfig, preset_config
from topl_core.training.memory import (
    GIB,
    check_fits,
    estimate_batch_memory,
    estimate_training_memory,
    largest_fitting_micro_batch,
    longest_micro_batch,
    synthetic_batch,
    traced_step,
)
from topl_core.training.methods import METHODS

H100_PEAKS = PROJECT_ROOT / "docs" / "bench" / "gpu-presets-h100.json"
SMOLLM2_TOKENIZER = cache_dir() / "models" / "smollm2-135m"
# every estimate within ±5 % of the measured peak (how far they were: docs/reliability.md, "Figures behind the
# tests' choices")
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def tiny_config():
    return build_tiny_model("tiny-llama")[0].config


def _tiny_on(config, device: str):
    from transformers import AutoModelForCausalLM

    with torch.device(device):  # eager attention on both: the CPU has no memory-efficient kernel
        return AutoModelForCausalLM.from_config(
            copy.deepcopy(config), dtype=torch.bfloat16, attn_implementation="eager"
        )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_meta_count_equals_the_count_on_real_tensors(tiny_config, method, checkpointing):
    cfg = TrainConfig(method=method, micro_batch_size=2, gradient_checkpointing=checkpointing, precision="fp32")
    cfg = cfg.with_overrides(lora_layer_end=2 if method == "topl" else 3, probe_layers=(1,) if method == "topl" else ())
    batch = synthetic_batch(method, 4, 96, 20)
    meta_peak, meta_params = traced_step(cfg, _tiny_on(tiny_config, "meta"), batch)
    real_peak, real_params = traced_step(cfg, _tiny_on(tiny_config, "cpu"), batch)
    assert meta_params == real_params
    # the real run also counts what is computed from the batch alone (masks, selected rows, labels: on the CPU in
    # both runs, so counted only in the real one): a few 512-byte blocks
    assert 0 <= real_peak - meta_peak <= 0.001 * real_peak, (meta_peak, real_peak)


def _micro_batches_the_h100_run_saw(cfg: TrainConfig, examples: list, pad_id: int) -> list:
    """The micro-batches the H100 preset runs (docs/bench/gpu-presets-h100.json) trained on: 4 steps of the
    preset's batches, micro-batches of 4."""
    objective = METHODS[cfg.method]
    batches = [objective.batches(g, 4, pad_id) for g in length_buckets(examples, cfg.batch_size)]
    return [batch_for(batches, i, cfg.seed) for i in range(4 * cfg.grad_accum)]


@pytest.mark.skipif(not SMOLLM2_TOKENIZER.exists(), reason="SmolLM2 not converted (scripts/setup.sh)")
def test_the_estimate_meets_the_peaks_measured_on_an_h100():
    from transformers import AutoTokenizer

    # the run's data: the first 400 records of the default data, tokenized with SmolLM2's tokenizer
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_TOKENIZER)
    train_records = split_records(read_jsonl(project_path(DEFAULT_DATA))[:400], seed=0)["train"]
    examples = {
        method: METHODS[method].prepare(tokenizer, train_records, EncodeSettings(320, 128))
        for method in ("topl", "sft")
    }
    rows = json.loads(H100_PEAKS.read_text())["rows"]
    assert len(rows) == 6
    for row in rows:
        cfg = preset_config(row["preset"], row["method"], micro_batch_size=4, precision="bf16")
        seen = _micro_batches_the_h100_run_saw(cfg, examples[row["method"]], tokenizer.pad_token_id)
        longest = longest_micro_batch(seen)
        estimate = estimate_batch_memory(cfg, preset_model_config(row["preset"]), longest)
        ratio = estimate.total / GIB / row["peak_gib"]
        assert abs(ratio - 1) <= TOLERANCE, (row["preset"], row["method"], ratio, estimate.describe())


def test_gradient_checkpointing_and_fewer_rows_need_less(tiny_config):
    cfg = TrainConfig(method="sft", micro_batch_size=4, precision="fp32").with_overrides(lora_layer_end=3)
    full = estimate_training_memory(cfg, tiny_config, 256)
    checkpointed = estimate_training_memory(cfg.with_overrides(gradient_checkpointing=True), tiny_config, 256)
    assert checkpointed.step < full.step and checkpointed.weights == full.weights
    assert estimate_training_memory(cfg, tiny_config, 256, micro_batch_size=2).step < full.step


def test_the_largest_fitting_micro_batch_fits_and_one_more_does_not(tiny_config):
    cfg = TrainConfig(method="topl", precision="fp32").with_overrides(lora_layer_end=2)
    budget = estimate_training_memory(cfg, tiny_config, 128, micro_batch_size=6).total + 1000
    rows = largest_fitting_micro_batch(cfg, tiny_config, 128, budget)
    assert rows >= 6
    assert estimate_training_memory(cfg, tiny_config, 128, rows).total <= budget
    assert estimate_training_memory(cfg, tiny_config, 128, rows + 1).total > budget
    weights = estimate_training_memory(cfg, tiny_config, 128, 1).weights
    assert largest_fitting_micro_batch(cfg, tiny_config, 128, weights) == 0


def test_a_step_that_does_not_fit_is_refused_with_the_fixes():
    model = build_tiny_model("tiny-llama")[0]  # as the trainer has it: the loaded model, whose config it passes
    tiny_config = model.config
    cfg = TrainConfig(method="topl", micro_batch_size=8, precision="fp32").with_overrides(lora_layer_end=2)
    batch = synthetic_batch("topl", 8, 128, 20)
    estimate = estimate_batch_memory(cfg, tiny_config, batch)
    assert model.config._attn_implementation == "sdpa"  # the model to be trained keeps its attention
    needed = estimate.trainable + estimate.step
    assert check_fits(cfg, tiny_config, batch, needed) == estimate
    with pytest.raises(ConfigError) as e:
        check_fits(cfg, tiny_config, batch, needed // 3)
    msg = str(e.value)
    assert "micro_batch_size=8" in msg and "GiB free" in msg and "8 × 128 tokens" in msg
    assert "--micro-batch-size " in msg and "--gradient-checkpointing" in msg and "fewer LoRA layers (now 0-2)" in msg
