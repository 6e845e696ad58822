"""One way to open a LoRA adapter, for every analysis command and page: a run directory of this workbench, a plain
PEFT folder (adapter_config.json + adapter weights, as TRL, PEFT's save_pretrained or a hub download leave it), or
a hub adapter id ("user/name", downloaded once into the hub cache).

    open_adapter(ref, base_model=None) -> Adapter     refuses up front what the analysis cannot handle
    load_adapter(base, adapter, merge=False) -> nn.Module   PeftModel.from_pretrained (unmerged) or merged

The base model comes from the run's config, or from adapter_config.json's `base_model_name_or_path` mapped to an
embedded model when it names one (HuggingFaceTB/SmolLM2-135M-Instruct is the embedded smollm2-135m); `base_model`
overrides both. The adapter's own r, lora_alpha, rank_pattern / alpha_pattern, use_rslora (scaling α/√r), target
modules ("all-linear" included), layers_to_transform and dropout are what PEFT builds from, so every analysis
honours them. Identity (cache keys) is a fingerprint of the adapter's files, as for runs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch

from ..foundations.errors import ModelError, RunError
from ..foundations.presets import LORA_MODULES
from ..models.loading import LoadedModel, hub_reachable, model_name_for
from .config import TrainConfig
from .run_dirs import ADAPTER_CONFIG, ADAPTER_WEIGHTS, RunDir, fingerprint_files

WEIGHT_FILES = (ADAPTER_WEIGHTS, "adapter_model.bin")  # PEFT's current and older weight files

Source = Literal["run", "peft", "hub"]


@dataclass(frozen=True)
class LoraSpec:
    """What adapter_config.json says about the LoRA: the values PEFT builds the adapter from."""

    r: int
    alpha: float
    use_rslora: bool = False
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ()  # names, or ("all-linear",), or (a regex,)
    layers_to_transform: tuple[int, ...] | None = None  # None: every layer
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)

    @classmethod
    def from_peft_config(cls, cfg: dict, where: Path) -> "LoraSpec":
        """Read adapter_config.json's dict; refuse what the analysis cannot handle, naming the reason."""
        peft_type = str(cfg.get("peft_type", "LORA")).upper()
        if peft_type != "LORA":
            raise ModelError(
                f"{where}: a {peft_type} adapter. The workbench opens LoRA adapters only (its analyses read LoRA's "
                "A and B matrices); train or export a LoRA adapter."
            )
        if cfg.get("use_dora"):
            raise ModelError(
                f"{where}: a DoRA adapter (use_dora=true). DoRA rescales each weight column by a learned magnitude, "
                "so LoRA-A projections and B-steering vectors do not describe what it does; use a plain LoRA adapter."
            )
        if cfg.get("modules_to_save"):
            raise ModelError(
                f"{where}: trains full copies of {cfg['modules_to_save']} (modules_to_save) besides the LoRA; the "
                "analysis covers LoRA in the decoder layers only. Use an adapter without modules_to_save."
            )
        targets = cfg.get("target_modules") or ()
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        outside = [t for t in targets if _is_plain_name(t) and t.split(".")[-1] not in LORA_MODULES]
        if outside and targets != ("all-linear",):
            raise ModelError(
                f"{where}: LoRA on {outside}, outside the decoder layers' {', '.join(LORA_MODULES)}; the analysis "
                "places LoRA sites in decoder layers only. Use an adapter on those modules."
            )
        layers = cfg.get("layers_to_transform")
        layers = (layers,) if isinstance(layers, int) else tuple(layers) if layers else None
        r = int(cfg.get("r", 8))
        return cls(
            r=r,
            alpha=float(cfg.get("lora_alpha", r)),
            use_rslora=bool(cfg.get("use_rslora", False)),
            dropout=float(cfg.get("lora_dropout", 0.0) or 0.0),
            target_modules=targets,
            layers_to_transform=layers,
            rank_pattern=dict(cfg.get("rank_pattern") or {}),
            alpha_pattern=dict(cfg.get("alpha_pattern") or {}),
        )

    def describe(self) -> str:
        """One line for tables, e.g. 'r 8, α 16 (rsLoRA), q_proj v_proj, layers 0–3'."""
        r = f"r {self.r}" + (f" (+{len(self.rank_pattern)} per-module)" if self.rank_pattern else "")
        alpha = f"α {self.alpha:g}" + (" (rsLoRA: α/√r)" if self.use_rslora else "")
        mods = " ".join(self.target_modules) if self.target_modules else "?"
        layers = "all layers" if self.layers_to_transform is None else f"layers {_ranges(self.layers_to_transform)}"
        return f"{r}, {alpha}, {mods}, {layers}"


@dataclass(frozen=True)
class Adapter:
    """An opened adapter: where its files are, what it is, and the base model it belongs to.

    Example: ``a = open_adapter("user/adapter-name"); a.base_model, a.method, a.has_head, a.lora.describe()``"""

    path: Path
    name: str
    source: Source
    base_model: str  # what load_model gets
    lora: LoraSpec
    run: RunDir | None = None  # when it is a run directory of this workbench

    @cached_property
    def _run_config(self) -> tuple[TrainConfig | None, dict]:
        """A run's topl_config.json, read once per opened adapter (every property below reads it)."""
        return self.run.read_config() if self.run is not None else (None, {})

    @property
    def train_config(self) -> TrainConfig | None:
        return self._run_config[0]

    @property
    def meta(self) -> dict:
        return self._run_config[1]

    @property
    def method(self) -> str | None:
        """The training method when known (a run's); None for an adapter from elsewhere."""
        cfg = self.train_config
        return cfg.method if cfg is not None else None

    @property
    def has_head(self) -> bool:
        return self.run is not None and self.run.head_path.exists()

    @property
    def head_layer(self) -> int | None:
        layer = self.meta.get("head_layer")
        return int(layer) if layer is not None else None

    @property
    def num_layers(self) -> int | None:
        n = self.meta.get("num_layers")
        return int(n) if n is not None else None

    @property
    def base_fingerprint(self) -> str | None:
        """The base model's fingerprint the adapter was trained on (runs record it; PEFT folders do not)."""
        return self.meta.get("base_fingerprint")

    @property
    def settings(self) -> TrainConfig:
        """Encoding lengths, data and split seed to analyse it with: the run's own, else the workbench defaults."""
        return self.train_config or TrainConfig(model=self.base_model)

    @property
    def device(self) -> str:
        """Where to analyse and steer it: the device it was trained on, or the CPU where that was a GPU this machine
        lacks (a run trained on a cluster, opened on a laptop)."""
        trained = self.settings.device
        return trained if trained == "cpu" or torch.cuda.is_available() else "cpu"

    def fingerprint(self) -> str:
        """Changes whenever the adapter's weights or config (or a run's head) change: cache keys, identity."""
        if self.run is not None:
            return self.run.fingerprint()
        return fingerprint_files([self.path / ADAPTER_CONFIG, *(self.path / f for f in WEIGHT_FILES)])

    def describe(self) -> dict:
        """What the UI lists about it."""
        return {
            "name": self.name,
            "source": self.source,
            "method": self.method or "unknown",
            "base model": self.base_model,
            "lora": self.lora.describe(),
            "head": "trained" if self.has_head else "none (fit a probe head)",
            "path": str(self.path),
        }


def _is_plain_name(target: str) -> bool:
    return all(c.isalnum() or c in "._" for c in target) and target != "all-linear"


def _ranges(layers) -> str:
    layers = sorted(set(layers))
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}–{a}")
            start = b
    return ", ".join(out)


def is_adapter_folder(path: Path) -> bool:
    """A folder holding a PEFT adapter (config and weights)."""
    return (path / ADAPTER_CONFIG).is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def find_adapter_folders(root: str | Path) -> list[Path]:
    """PEFT adapter folders that are not run directories, directly under root or one folder down (e.g.
    runs/imported/<name>): what the app lists beside the runs. Run and sweep directories are not searched."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if RunDir(d).config_path.exists() or (d / "sweep.json").exists():
            continue
        if is_adapter_folder(d):
            out.append(d)
        else:
            out += [
                c
                for c in sorted(d.iterdir())
                if c.is_dir() and is_adapter_folder(c) and not RunDir(c).config_path.exists()
            ]
    return out


def open_adapter(ref: "Adapter | RunDir | str | Path", base_model: str | None = None) -> Adapter:
    """Open a run directory, a plain PEFT folder or a hub adapter id; `base_model` overrides the base model the
    adapter names. Refuses (RunError / ModelError, with the fix) what is missing, unfinished or not analysable.

    Example: ``adapter = open_adapter("examples/adapters/topl-smollm2"); adapter.describe()``"""
    if isinstance(ref, Adapter):
        return replace(ref, base_model=base_model) if base_model else ref
    path = ref.path if isinstance(ref, RunDir) else Path(ref).expanduser()
    if path.is_dir():
        return _open_folder(path, "peft", base_model)
    text = str(ref)
    if _looks_like_hub_id(text):
        return _open_folder(_download(text), "hub", base_model, name=text)
    raise RunError(
        f"{text}: no such folder. Give a run directory, a PEFT adapter folder (adapter_config.json + "
        "adapter_model.safetensors) or a hub adapter id such as user/adapter-name."
    )


def _open_folder(path: Path, source: Source, base_model: str | None, name: str | None = None) -> Adapter:
    run = RunDir(path)
    is_run = run.config_path.exists()
    if not is_adapter_folder(path):
        if is_run:
            state = run.read_status().get("state", "unknown")
            raise RunError(
                f"{path}: no finished adapter (run state: {state}). Wait for the run to finish, or resume it with "
                f"python -m topl_core train --resume {path}."
            )
        raise RunError(
            f"{path}: neither a run directory (topl_config.json) nor a PEFT adapter folder (adapter_config.json + "
            "adapter_model.safetensors). Point at the folder that holds those files."
        )
    try:
        peft_cfg = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"{path / ADAPTER_CONFIG}: unreadable ({e}); restore or re-download the adapter.") from e
    lora = LoraSpec.from_peft_config(peft_cfg, path)
    if is_run:
        base = base_model or run.read_config()[0].model
        return Adapter(path, name or path.name, "run", base, lora, run)
    named = peft_cfg.get("base_model_name_or_path")
    if not base_model and not named:
        raise ModelError(
            f"{path / ADAPTER_CONFIG} names no base model (base_model_name_or_path); give the model it was trained on "
            "(--base-model, or the sidebar's model)."
        )
    return Adapter(path, name or path.name, source, base_model or model_name_for(named), lora)


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and " " not in text


def _download(repo_id: str) -> Path:
    """The adapter's files from the hub (cached there after the first download)."""
    from huggingface_hub import snapshot_download

    try:
        if not hub_reachable():
            raise OSError("the hub endpoint did not answer")
        return Path(snapshot_download(repo_id, allow_patterns=[ADAPTER_CONFIG, *WEIGHT_FILES, "README.md"]))
    except Exception as e:
        raise RunError(
            f"{repo_id}: not a folder here, and the hub adapter could not be fetched ({str(e).splitlines()[0]}). "
            "Download the adapter folder where the hub is reachable and give its path."
        ) from e


_ADAPTER_LOCK = threading.Lock()


def load_adapter(base: LoadedModel, adapter: "Adapter | RunDir | str | Path", merge: bool = False) -> torch.nn.Module:
    """Wrap a base model with the adapter (PeftModel, unmerged), or return it merged when merge=True.

    The base model is modified in place by PEFT injection: give it a model you own (not a shared cached one).

    Example: ``peft_model = load_adapter(load_model(adapter.base_model), adapter)``"""
    from peft import PeftModel

    adapter = open_adapter(adapter)
    if adapter.run is not None:
        adapter.run.check_base(base)
    with _ADAPTER_LOCK:
        try:
            model = PeftModel.from_pretrained(base.model, adapter.path)
        except Exception as e:
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            if "size mismatch" in str(e) or "shape" in str(e).lower():
                raise ModelError(
                    f"{adapter.name}: its weights do not fit {base.spec.name!r} ({first}). The adapter belongs to "
                    f"another base model (it names {adapter.base_model!r}); load that one."
                ) from e
            raise RunError(
                f"{adapter.path}: PEFT could not load the adapter ({first}); the files may be corrupt."
            ) from e
        model.eval()
        return model.merge_and_unload() if merge else model
