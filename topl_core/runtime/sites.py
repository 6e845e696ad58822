"""LoRA sites: the (layer, module) places where an adapter holds a LoRA pair, and their geometry.

    lora_sites(model) -> list[Site]                      PEFT model (Llama, Qwen3, Gemma3 families; Qwen2/Mistral too)
    Site(layer, module, path)                            path is relative to the *ForCausalLM, e.g.
                                                         "model.layers.3.self_attn.o_proj", so the same Site resolves
                                                         in the PEFT-wrapped model and in the merged model
    site_module(model, site) -> nn.Module                the module at site.path (PEFT-wrapped or merged model)
    input_module(model, site) -> nn.Module               the module whose *input* is x (the LoRA layer's base_layer)
    lora_weights(model, site, adapter=None) -> LoraWeights   A (r, d_in), B (d_out, r), scaling, read from PEFT
    read_lora_weights(run) -> dict[Site, LoraWeights]    the same, read from a run's adapter files (no model needed)
    active_adapter_name(model) -> str

Sites are ordered by layer, then by module in the order q, k, v, o, gate, up, down (LORA_MODULES).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import torch

from ..foundations.errors import ModelError
from ..foundations.presets import LORA_MODULES
from ..models.architecture import base_causal_lm, decoder_layers
from ..training.run_dirs import RunDir

RESIDUAL_MODULES: tuple[str, ...] = ("o_proj", "down_proj")  # outputs live in the residual stream (steerable)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen3", "qwen2", "mistral", "gemma3_text", "gemma3")

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True, order=True)
class Site:
    """One LoRA site. `path` is the module's name relative to the *ForCausalLM (not the PeftModel)."""

    layer: int
    module: str
    path: str

    @property
    def key(self) -> str:
        """Short stable name, e.g. 'L3.o_proj' (tensor names, table rows, cache files)."""
        return f"L{self.layer}.{self.module}"

    @property
    def residual(self) -> bool:
        return self.module in RESIDUAL_MODULES

    def to_json(self) -> dict:
        return {"layer": self.layer, "module": self.module, "path": self.path}

    @classmethod
    def from_json(cls, d: dict) -> "Site":
        return cls(int(d["layer"]), str(d["module"]), str(d["path"]))


def _sort_key(site: Site) -> tuple[int, int]:
    return site.layer, LORA_MODULES.index(site.module)


def sort_sites(sites) -> list[Site]:
    return sorted(sites, key=_sort_key)


@dataclass(frozen=True)
class LoraWeights:
    """One site's LoRA pair: delta W = scaling * B @ A. A is (r, d_in), B is (d_out, r), float32 on CPU."""

    A: torch.Tensor
    B: torch.Tensor
    scaling: float

    @property
    def r(self) -> int:
        return int(self.A.shape[0])


def _check_architecture(model: torch.nn.Module) -> str:
    inner = base_causal_lm(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelError(
            f"LoRA analysis does not know architecture {type(inner).__name__} (model_type={model_type!r}). Supported "
            f"model types: {', '.join(SUPPORTED_MODEL_TYPES)} (decoder layers at model.model.layers with modules "
            f"{', '.join(LORA_MODULES)}). Use a Llama, Qwen3 or Gemma3 family model, or add the type to "
            "topl_core.runtime.sites.SUPPORTED_MODEL_TYPES if its layout matches."
        )
    decoder_layers(model)  # raises ModelError with its own advice when the layout differs
    return model_type


def _parse_site(path: str) -> Site | None:
    m = _LAYER_RE.search(path)
    module = path.rsplit(".", 1)[-1]
    if m is None or module not in LORA_MODULES:
        return None
    return Site(int(m.group(1)), module, path)


def residual_paths(model: torch.nn.Module) -> list[str]:
    """The path of every steerable module of a plain or merged model (its decoder layers' RESIDUAL_MODULES), in the
    model's order: the sites any steering vectors of it can name (a compiled decode step shifts them all, so one
    step serves every choice of sites)."""
    sites = (_parse_site(name) for name, _ in base_causal_lm(model).named_modules())
    return [site.path for site in sites if site is not None and site.residual]


def lora_sites(model: torch.nn.Module) -> list[Site]:
    """Every LoRA site of a PEFT-wrapped model, ordered by layer then q, k, v, o, gate, up, down.

    Raises ModelError for an unknown architecture, for LoRA on modules outside LORA_MODULES, and for a model
    that holds no LoRA layers (a plain or merged model: load the run with load_adapter(base, run), merge=False)."""
    from peft.tuners.lora import LoraLayer

    _check_architecture(model)
    inner = base_causal_lm(model)
    sites, unknown = [], []
    for name, module in inner.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        site = _parse_site(name)
        if site is None:
            unknown.append(name)
        else:
            sites.append(site)
    if unknown:
        raise ModelError(
            f"LoRA on modules the analysis cannot place: {unknown[:4]}{' …' if len(unknown) > 4 else ''}. "
            f"Supported sites are decoder layers' {', '.join(LORA_MODULES)}."
        )
    if not sites:
        raise ModelError(
            f"{type(inner).__name__} holds no LoRA layers: LoRA-A analysis needs the unmerged adapter. Load it with "
            "topl_core.training.adapters.load_adapter(base, run) (merge=False), or read weights with "
            "read_lora_weights(run)."
        )
    return sort_sites(sites)


def site_module(model: torch.nn.Module, site: Site) -> torch.nn.Module:
    """The module at site.path in a PEFT-wrapped, merged or plain model."""
    try:
        return base_causal_lm(model).get_submodule(site.path)
    except AttributeError as e:
        raise ModelError(
            f"{site.key}: no module {site.path!r} in {type(base_causal_lm(model)).__name__}; the sites belong to "
            "another architecture (check the adapter's base model)."
        ) from e


def input_module(model: torch.nn.Module, site: Site) -> torch.nn.Module:
    """The module whose input is the LoRA layer's input x: the PEFT base_layer (called whether the adapter is
    active, disabled or merged), or the plain Linear of a merged/unloaded model."""
    module = site_module(model, site)
    return getattr(module, "base_layer", module)


def active_adapter_name(model: torch.nn.Module) -> str:
    name = getattr(model, "active_adapter", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name or "default"


def lora_weights(model: torch.nn.Module, site: Site, adapter: str | None = None) -> LoraWeights:
    """A, B and scaling of one site, read from PEFT's lora_A[adapter], lora_B[adapter], scaling[adapter]."""
    module = site_module(model, site)
    adapter = adapter or active_adapter_name(model)
    if not hasattr(module, "lora_A") or adapter not in module.lora_A:
        have = list(getattr(module, "lora_A", {}).keys())
        raise ModelError(f"{site.key}: no LoRA adapter {adapter!r} at {site.path} (adapters there: {have}).")
    return LoraWeights(
        module.lora_A[adapter].weight.detach().float().cpu().clone(),
        module.lora_B[adapter].weight.detach().float().cpu().clone(),
        float(module.scaling[adapter]),
    )


def _pattern_value(patterns: dict, path: str, default):
    for pattern, value in (patterns or {}).items():
        if re.search(rf"(^|\.){pattern}$", path) or re.fullmatch(pattern, path):
            return value
    return default


def read_lora_weights(run) -> dict[Site, LoraWeights]:
    """Every site's LoRA pair from a run directory (adapter_config.json + adapter_model.safetensors), without
    loading a model: for analysing or steering a merged model."""
    from safetensors.torch import load_file

    run_dir = RunDir.of(getattr(run, "path", run))
    path, cfg_path, weights_path = run_dir.path, run_dir.adapter_config_path, run_dir.adapter_path
    if not cfg_path.exists() or not weights_path.exists():
        raise ModelError(f"{path}: no adapter_config.json / adapter_model.safetensors — not a finished LoRA run.")
    cfg = json.loads(cfg_path.read_text())
    tensors = load_file(weights_path)
    out: dict[Site, LoraWeights] = {}
    for name, a in tensors.items():
        if ".lora_A." not in name:
            continue
        stem = name.split(".lora_A.")[0]
        b = tensors.get(name.replace(".lora_A.", ".lora_B."))
        rel = stem[len("base_model.model.") :] if stem.startswith("base_model.model.") else stem
        site = _parse_site(rel)
        if site is None or b is None:
            raise ModelError(f"{weights_path}: cannot place LoRA tensor {name!r} on a decoder-layer site.")
        r = int(a.shape[0])
        alpha = float(_pattern_value(cfg.get("alpha_pattern"), rel, cfg.get("lora_alpha", r)))
        scaling = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
        out[site] = LoraWeights(a.float(), b.float(), scaling)
    if not out:
        raise ModelError(f"{weights_path}: holds no LoRA tensors.")
    return {s: out[s] for s in sort_sites(out)}
