"""LoRA's layer range when none is given follows the model's own depth (presets.default_lora_end: ⌊2n/3⌋, every layer
for a method defined on all layers), and a paper preset's range is carried to another model's depth at the same
fraction — never another model's numbers (a range fixed at SmolLM2's 0–20 stopped every shallower model)."""

from __future__ import annotations

import json

import pytest

from topl_core.cli import main
from topl_core.data.records import write_jsonl
from topl_core.foundations.errors import ConfigError
from topl_core.foundations.presets import PRESETS, default_lora_end
from topl_core.models.loading import LoadedModel, ModelSpec, load_model
from topl_core.training.config import LoraSettings, TrainConfig, preset_config
from topl_core.training.trainer import train


def test_default_range_is_a_fraction_of_the_depth():
    """SmolLM2's 30 layers keep the measured 20, Gemma-3-270M's 18 get 12, every depth stays inside its layers."""
    assert [default_lora_end(n) for n in (1, 2, 4, 7, 18, 30, 36)] == [0, 1, 2, 4, 12, 20, 24]
    assert all(0 <= default_lora_end(n) < n for n in range(1, 200))
    cfg = TrainConfig()
    assert cfg.lora.layer_end is None  # left to the model until it is known
    assert cfg.for_depth(18).lora.layers == list(range(13))
    assert cfg.for_depth(30).lora.layer_end == 20
    assert TrainConfig(method="tldr").for_depth(18).lora.layer_end == 17  # TLDR: LoRA on every layer
    given = TrainConfig(lora=LoraSettings(layer_end=5))
    assert given.for_depth(18) is given  # a range given stays as it is
    with pytest.raises(ConfigError, match="for_depth"):
        cfg.lora.layers  # noqa: B018 (the property raises)
    with pytest.raises(ConfigError, match="probe_layers"):  # probes checked against the range once it is known
        TrainConfig(probe_layers=(15,)).for_depth(18)


def test_a_preset_on_another_model_keeps_its_fraction_of_the_depth():
    """--preset qwen3-8b on a 30-layer model: Qwen3-8B's TOPL layers 0–29 of 36 become 0–24; on its own model they
    stay 0–29; a baseline's 'every layer' is every layer of the model trained."""
    assert (preset_config("qwen3-8b", "topl").lora.layer_end, PRESETS["qwen3-8b"].num_layers) == (29, 36)
    assert preset_config("qwen3-8b", "topl", num_layers=30, model="smollm2-135m").lora.layer_end == 24
    assert preset_config("qwen3-8b", "sft", num_layers=18, model="gemma3-270m").lora.layer_end == 17
    # the depth read from the model's config when not given (a tiny model: 4 layers, 29/35 · 3 → 2)
    assert preset_config("qwen3-8b", "topl", model="tiny-gemma3", device="cpu").lora.layer_end == 2


def _deeper(family: str, num_layers: int) -> LoadedModel:
    """A tiny random model of `family` with num_layers decoder layers (the tiny models have 4)."""
    tiny = load_model(ModelSpec(family))
    cfg = tiny.model.config.to_dict() | {"num_hidden_layers": num_layers}
    if "layer_types" in cfg:  # Gemma 3 lists each layer's attention kind
        cfg["layer_types"] = [cfg["layer_types"][i % len(cfg["layer_types"])] for i in range(num_layers)]
    model = type(tiny.model)(type(tiny.model.config).from_dict(cfg)).eval()
    return LoadedModel(model, tiny.tokenizer, tiny.spec)


@pytest.mark.parametrize(("family", "depth"), [("tiny-llama", 7), ("tiny-gemma3", 3)])
def test_training_without_a_range_takes_the_models_depth(tmp_path, tiny_records, family, depth):
    """train() on models of 7 and 3 layers with no range given: LoRA on 0..⌊2n/3⌋, recorded as numbers, the head
    after that layer; training the same config into the same folder again finds the finished run (no 'different
    config')."""
    cfg = TrainConfig(model=family, steps=1, batch_size=2, eval_every=1, max_doc_tokens=48, precision="fp32")
    run = train(cfg, tmp_path / "r", records=tiny_records[:12], base=_deeper(family, depth))
    saved = json.loads((run.path / "topl_config.json").read_text())
    end = default_lora_end(depth)
    assert (saved["config"]["lora"]["layer_start"], saved["config"]["lora"]["layer_end"]) == (0, end)
    assert saved["meta"]["head_layer"] == end and saved["meta"]["num_layers"] == depth
    layers = json.loads((run.path / "adapter_config.json").read_text())["layers_to_transform"]
    assert layers == list(range(end + 1))
    assert train(cfg, tmp_path / "r", records=tiny_records[:12], base=_deeper(family, depth)).is_complete


def test_train_command_on_a_shallower_model_needs_no_layer_flag(tmp_path, tiny_records):
    """`train --model tiny-gemma3 --method topl` with no --lora-layer-end trains (it once stopped with "LoRA layer
    range [0, 20] is outside the model's layers 0..3") and records 0–2."""
    data = write_jsonl(tiny_records[:12], tmp_path / "d.jsonl")
    out = tmp_path / "gemma"
    argv = ["train", "--model", "tiny-gemma3", "--method", "topl", "--steps", "1", "--data", str(data)]
    assert main([*argv, "--out", str(out), "--max-doc-tokens", "48", "--eval-every", "1", "--precision", "fp32"]) == 0
    assert json.loads((out / "topl_config.json").read_text())["config"]["lora"]["layer_end"] == 2
