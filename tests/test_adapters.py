"""Opening adapters the workbench did not train: plain PEFT folders made here with PEFT itself on the tiny models
(other ranks and alphas, rsLoRA, "all-linear", layers_to_transform, rank / alpha patterns), holding no file of
ours. Their sites, scaling, LoRA-A projections and merge are checked against a direct computation from the
safetensors; what the analysis cannot handle is refused with the reason; a probe head stands in for a TOPL head."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model
from safetensors.torch import load_file

from topl_core.analysis.lora_a.capture import collect_projections
from topl_core.analysis.lora_a.probe import ProbeSettings, labelled_records, probe_run, run_projections
from topl_core.analysis.lora_a.probe_head import ProbeHeadSettings, fit_probe_head
from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.foundations.errors import ModelError, RunError
from topl_core.foundations.presets import LORA_MODULES
from topl_core.inference.token_scores import TokenScorer
from topl_core.models.forward import head_features
from topl_core.models.loading import load_model, model_name_for
from topl_core.runtime.sites import lora_sites, lora_weights, read_lora_weights
from topl_core.training.adapters import load_adapter, open_adapter

ALL = list(LORA_MODULES)
CASES = {
    "r4-alpha16-qv": dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "rslora-r8-alpha4": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["o_proj", "down_proj"]),
    "all-linear": dict(r=2, lora_alpha=2, target_modules="all-linear"),
    "layers-1-3": dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"], layers_to_transform=[1, 3]),
    "patterns": dict(
        r=4,
        lora_alpha=8,
        target_modules=["o_proj", "down_proj", "up_proj"],
        rank_pattern={"down_proj": 2},
        alpha_pattern={"o_proj": 32},
    ),
}


def make_peft_folder(path, family: str = "tiny-llama", base_name: str | None = "tiny-llama", seed: int = 0, **lora):
    """An adapter saved by PEFT's own save_pretrained, with random (non-zero) A and B."""
    torch.manual_seed(seed)
    model = load_model(family).model
    peft = get_peft_model(model, LoraConfig(init_lora_weights=False, lora_dropout=0.05, **lora))
    peft.peft_config["default"].base_model_name_or_path = base_name
    peft.save_pretrained(path)
    return path


def expected_scaling(cfg: dict, module: str, r: int) -> float:
    alpha = cfg.get("alpha_pattern", {}).get(module, cfg["lora_alpha"])
    return alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)


@pytest.mark.parametrize("case", CASES)
def test_a_plain_peft_folder_opens_with_its_own_geometry(case, tmp_path):
    folder = make_peft_folder(tmp_path / case, **CASES[case])
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    adapter = open_adapter(folder)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert (adapter.source, adapter.base_model, adapter.method, adapter.has_head) == ("peft", "tiny-llama", None, False)
    assert adapter.lora.r == cfg["r"] and adapter.lora.use_rslora == bool(cfg.get("use_rslora"))

    tensors = load_file(folder / "adapter_model.safetensors")
    model = load_adapter(load_model("tiny-llama"), adapter)
    sites = lora_sites(model)
    # the sites are exactly the tensors in the file
    in_file = {k.split(".lora_A.")[0].removeprefix("base_model.model.") for k in tensors if ".lora_A." in k}
    assert {s.path for s in sites} == in_file
    layers = CASES[case].get("layers_to_transform")
    if layers:
        assert {s.layer for s in sites} == set(layers)
    if CASES[case]["target_modules"] == "all-linear":
        assert {s.module for s in sites} == set(ALL)
    from_files = read_lora_weights(folder)
    for s in sites:
        a = tensors[f"base_model.model.{s.path}.lora_A.weight"]
        b = tensors[f"base_model.model.{s.path}.lora_B.weight"]
        want = expected_scaling(cfg, s.module, a.shape[0])
        w = lora_weights(model, s)
        assert w.scaling == pytest.approx(want) and from_files[s].scaling == pytest.approx(want), s.key
        assert torch.equal(w.A, a.float()) and torch.equal(w.B, b.float())
        assert torch.equal(from_files[s].A, a.float())


@pytest.mark.parametrize("case", ["rslora-r8-alpha4", "patterns"])
def test_merge_adds_scaling_B_A_from_the_file(case, tmp_path):
    """load_adapter(merge=True) (PEFT's merge_and_unload) changes each site's weight by exactly scaling·B·A with A, B
    read from the safetensors and the scaling computed from adapter_config.json (α/r, α/√r with rsLoRA, patterns)."""
    folder = make_peft_folder(tmp_path / case, **CASES[case])
    cfg = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(folder / "adapter_model.safetensors")
    plain = load_model("tiny-llama").model
    merged = load_adapter(load_model("tiny-llama"), folder, merge=True)
    for name in {k.split(".lora_A.")[0].removeprefix("base_model.model.") for k in tensors if ".lora_A." in k}:
        a = tensors[f"base_model.model.{name}.lora_A.weight"]
        b = tensors[f"base_model.model.{name}.lora_B.weight"]
        delta = merged.get_submodule(name).weight - plain.get_submodule(name).weight
        want = expected_scaling(cfg, name.rsplit(".", 1)[-1], a.shape[0]) * (b @ a)
        torch.testing.assert_close(delta, want, atol=1e-6, rtol=1e-5)


def test_projections_of_a_peft_folder_are_A_times_the_inputs(tmp_path, tiny_records):
    """The cached pipeline (run_projections) on a folder without any file of ours gives, at every site, the A of
    the safetensors applied to the site's input x."""
    folder = make_peft_folder(tmp_path / "pf", **CASES["layers-1-3"])
    records = labelled_records(tiny_records)[:6]
    settings = ProbeSettings(random_control=False, max_doc_tokens=64, max_response_tokens=32)
    proj = run_projections(folder, records, settings, use_cache=False)["lora"]
    tensors = load_file(folder / "adapter_model.safetensors")
    lm = load_model("tiny-llama")
    model = load_adapter(lm, folder)
    keys = [s.key for s in proj.sites]
    raw = collect_projections(model, lm.tokenizer, records, max_doc_tokens=64, max_response_tokens=32, keep_inputs=keys)
    for s in proj.sites:
        a = tensors[f"base_model.model.{s.path}.lora_A.weight"].numpy()
        np.testing.assert_allclose(proj[s], raw.inputs[s.key] @ a.T, atol=1e-4, rtol=1e-4)
    # and the probe runs on it (no run directory, no topl_config.json)
    res = probe_run(
        folder,
        records,
        ProbeSettings(random_control=True, max_doc_tokens=64, max_response_tokens=32, n_boot=50),
        use_cache=False,
    )
    assert {(s.site.layer, s.site.module) for s in res.lora.scores} == {
        (1, "q_proj"),
        (1, "o_proj"),
        (3, "q_proj"),
        (3, "o_proj"),
    }
    assert res.control is not None and res.adapter_fingerprint == open_adapter(folder).fingerprint()


def test_steering_vectors_from_a_peft_folder(tmp_path, tiny_records):
    folder = make_peft_folder(tmp_path / "pf", **CASES["rslora-r8-alpha4"])
    vectors = build_steering_vectors(folder, labelled_records(tiny_records)[:8], top_k=2, use_cache=False)
    assert len(vectors.sites) == 2 and all(s.module in ("o_proj", "down_proj") for s in vectors.sites)
    assert vectors.adapter_fingerprint == open_adapter(folder).fingerprint() and vectors.base_model == "tiny-llama"


@pytest.mark.parametrize(
    "config, match",
    [
        (LoraConfig(r=4, target_modules=["q_proj"], use_dora=True), "DoRA"),
        (IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]), "IA3"),
        (LoraConfig(r=4, target_modules=["q_proj", "lm_head"]), "outside the decoder layers"),
        (LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]), "modules_to_save"),
    ],
    ids=["dora", "ia3", "lm_head", "modules_to_save"],
)
def test_what_the_analysis_cannot_handle_is_refused_up_front(config, match, tmp_path):
    peft = get_peft_model(load_model("tiny-llama").model, config)
    peft.save_pretrained(tmp_path / "x")
    with pytest.raises(ModelError, match=match):
        open_adapter(tmp_path / "x", base_model="tiny-llama")


def test_bad_folders_and_ids_say_what_is_wrong(tmp_path, monkeypatch):
    from huggingface_hub import constants

    folder = make_peft_folder(tmp_path / "ok", **CASES["r4-alpha16-qv"])
    with pytest.raises(RunError, match="neither a run directory"):
        open_adapter(tmp_path)  # a folder without adapter files
    with pytest.raises(RunError, match="no such folder"):
        open_adapter(tmp_path / "missing" / "deeper")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RunError, match="could not be fetched"):
        open_adapter("someone/some-adapter")
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(RunError, match="unreadable"):
        open_adapter(folder)
    nameless = make_peft_folder(tmp_path / "nameless", base_name=None, **CASES["r4-alpha16-qv"])
    with pytest.raises(ModelError, match="names no base model"):
        open_adapter(nameless)
    assert open_adapter(nameless, base_model="tiny-llama").base_model == "tiny-llama"


def test_an_adapter_for_another_model_is_refused_when_loaded(tmp_path):
    """An adapter loaded on a model of other widths: a clear error naming the model it belongs to."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from topl_core.models.loading import LoadedModel, ModelSpec

    folder = make_peft_folder(tmp_path / "llama", **CASES["r4-alpha16-qv"])
    tiny = load_model("tiny-llama")
    cfg = tiny.model.config.to_dict() | {"hidden_size": 32, "intermediate_size": 64, "head_dim": 8}
    wider = LoadedModel(LlamaForCausalLM(LlamaConfig(**cfg)).eval(), tiny.tokenizer, ModelSpec("tiny-llama"))
    with pytest.raises(ModelError, match="do not fit .* belongs to another base model"):
        load_adapter(wider, folder)


def test_the_embedded_model_is_known_by_its_hub_id():
    assert model_name_for("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m"
    assert model_name_for("smollm2-135m") == "smollm2-135m"
    assert model_name_for("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


def test_a_probe_head_for_an_adapter_without_one(tmp_path, tiny_records):
    """The probe head is fitted at the adapter's last LoRA layer on FinalNorm(hidden), reports its validation AUROC, and
    TokenScorer with it gives σ(w·H + b) exactly; the base-model control is a different probe."""
    folder = make_peft_folder(tmp_path / "pf", **CASES["layers-1-3"])
    with pytest.raises(RunError, match="no head"):
        TokenScorer(load_model("tiny-llama"), folder)
    settings = ProbeHeadSettings(max_records=24, max_val_records=8)
    probe = fit_probe_head(folder, tiny_records, settings, use_cache=False)
    control = fit_probe_head(folder, tiny_records, settings, adapter_enabled=False, use_cache=False)
    assert probe.layer == 3 and probe.adapter_enabled and not control.adapter_enabled
    assert 0 <= probe.val_auroc <= 1 and probe.n_train_tokens > 0 and probe.n_val_tokens > 0
    assert probe.weight != control.weight
    scorer = TokenScorer(load_model("tiny-llama"), folder, head=(probe.layer, probe.linear()))
    rec = labelled_records(tiny_records)[0]
    s = scorer.score([rec])[0]
    e = scorer.encode([rec])[0]
    ids = torch.tensor([e.input_ids])
    with torch.no_grad():
        h = head_features(scorer.model, ids, torch.ones_like(ids), 3)[0, e.response_start : e.response_end]
    want = torch.sigmoid(h @ torch.tensor(probe.weight) + probe.bias).numpy()
    np.testing.assert_allclose(s.p_good, want, atol=1e-5)
