"""What llama.cpp needs to steer as the workbench does: the control vector (control_vector.py) and, beside it, the
adapter's LoRA as a llama.cpp LoRA adapter (GGUF) — the vectors were computed on base + LoRA (the merged model), so
llama.cpp needs both:

    llama-completion -m BASE-F32.gguf --lora VECTOR.lora.gguf --control-vector-scaled VECTOR.gguf:λ …

    export_for_llama_cpp(vectors, path, mode, units, config) -> LlamaCppExport
        writes the mode's λ = 1 vectors at `path` and the adapter's LoRA at lora_gguf_path(path); .command(λ) is the
        llama.cpp line that runs them (llama.cpp's scale is the workbench's λ in the exported units).
    save_control_vector(vectors, path, mode, units, model_type, layer_count) -> list[str]   the control vector alone
        (the sites it leaves out: layer 0)
    write_adapter_lora(vectors, path, config) -> Path     the LoRA alone (one file serves every mode's vector)
    write_lora_gguf(path, lora, model_hint, n_head, n_head_kv) -> Path
        lora: {Site: LoraWeights} (runtime.sites.read_lora_weights); model_hint: the llama.cpp architecture
        (control_vector.model_hint_for); n_head / n_head_kv: the model's attention and key-value head counts.

What llama.cpp reads (src/llama-adapter.cpp, llama_adapter_lora_init): general.type = "adapter", adapter.type =
"lora", general.architecture equal to the model's, and per adapted weight "<tensor>.lora_a" (ggml ne = [d_in, r],
torch's (r, d_in) A as stored) and "<tensor>.lora_b" (ne = [r, d_out]); it adds scale · B(A x) with scale =
adapter.lora.alpha / r, or the --lora scale itself when alpha is 0. Each site's PEFT scaling (alpha / r, alpha / √r
with rsLoRA, per-module alpha_pattern) is folded into its B here and alpha written as 0, so every site keeps its own
scaling. llama.cpp's convert_hf_to_gguf.py permutes the rows of a Llama's q_proj and k_proj (its rotary layout); a
LoRA on them gets the same permutation of B's rows, as convert_lora_to_gguf.py does.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from ...foundations.errors import ModelError
from ...foundations.io import atomic_path
from ...runtime.modes import MODES, steering_mode
from ...runtime.sites import LoraWeights, Site
from ...runtime.vectors import SteeringVectors
from .control_vector import control_vector_layers, model_hint_for, write_control_vector

# HF module name -> llama.cpp tensor name inside block N ("blk.N.<name>.weight"), as gguf's TensorNameMap maps them
GGUF_TENSOR_NAMES: dict[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}
ROTARY_PERMUTED: frozenset[str] = frozenset({"llama"})  # architectures whose q/k rows convert_hf_to_gguf permutes


def lora_gguf_path(control_vector_path: str | os.PathLike) -> Path:
    """Where the LoRA adapter goes beside a control vector: VECTOR.gguf -> VECTOR.lora.gguf."""
    path = Path(control_vector_path)
    return path.with_name(f"{path.stem}.lora.gguf")


def _rotary_permute(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's LlamaModel.permute on the output rows: within each head, the interleaved rotary halves."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_lora_tensors(
    lora: Mapping[Site, LoraWeights], model_hint: str, n_head: int, n_head_kv: int
) -> dict[str, np.ndarray]:
    """{"blk.N.<tensor>.weight.lora_a" / ".lora_b": float32 array} in llama.cpp's layout, scaling folded into B."""
    tensors: dict[str, np.ndarray] = {}
    for site, w in lora.items():
        name = GGUF_TENSOR_NAMES.get(site.module)
        if name is None:
            raise ModelError(
                f"{site.key}: llama.cpp has no LoRA target for {site.module!r}; export adapters on "
                f"{', '.join(GGUF_TENSOR_NAMES)} only."
            )
        b = w.B.float() * w.scaling
        if model_hint in ROTARY_PERMUTED and site.module in ("q_proj", "k_proj"):
            b = _rotary_permute(b, n_head if site.module == "q_proj" else n_head_kv)
        stem = f"blk.{site.layer}.{name}.weight"
        tensors[f"{stem}.lora_a"] = np.ascontiguousarray(w.A.float().numpy(), dtype=np.float32)
        tensors[f"{stem}.lora_b"] = np.ascontiguousarray(b.numpy(), dtype=np.float32)
    return tensors


def write_lora_gguf(
    path: str | os.PathLike, lora: Mapping[Site, LoraWeights], model_hint: str, n_head: int, n_head_kv: int
) -> Path:
    """Write `lora` as a llama.cpp LoRA adapter GGUF at `path`, atomically (see the module docstring)."""
    import gguf

    if not lora:
        raise ModelError("No LoRA sites to export: the adapter holds no LoRA pairs.")
    tensors = gguf_lora_tensors(lora, model_hint, n_head, n_head_kv)
    path = Path(path)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, model_hint)  # llama.cpp refuses an adapter of another architecture
        try:
            writer.add_type(gguf.GGUFType.ADAPTER)
            writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
            writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 0.0)  # 0: scale = --lora's, the scaling is in B
            for name in sorted(tensors):
                writer.add_tensor(name, tensors[name])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return path


@dataclass(frozen=True)
class LlamaCppExport:
    """The files of one export and the sites no control vector can carry (layer 0)."""

    vector: Path
    lora: Path
    left_out: tuple[str, ...]

    def command(self, lam: float, model: str = "BASE-F32.gguf") -> str:
        """The llama.cpp line that generates with this steering at λ = `lam` (greedy, as the workbench's default).
        `model`: the base model as a GGUF in the precision to compare (F32 for the workbench's fp32)."""
        files = ["-m", model, "--lora", str(self.lora), "--control-vector-scaled", f"{self.vector}:{lam:g}"]
        return shlex.join(["llama-completion", *files, "--temp", "0", "-p", "PROMPT"])


def text_config(config):
    """The decoder's own config (a multimodal Gemma3's text_config; the config itself otherwise)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def write_adapter_lora(vectors: SteeringVectors, path: str | os.PathLike, config) -> Path:
    """The LoRA of the adapter `vectors` came from, as a llama.cpp adapter at `path` (config: the base model's)."""
    text = text_config(config)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return write_lora_gguf(path, vectors.adapter_lora(), model_hint_for(text.model_type), heads, kv_heads)


def save_control_vector(
    vectors: SteeringVectors,
    path: str | os.PathLike,
    mode: str = "vector",
    units: str = "normalised",
    model_type: str = "llama",
    layer_count: int | None = None,
) -> list[str]:
    """The mode's λ = 1 vectors as a llama.cpp control vector (GGUF; control_vector.py): llama.cpp's
    `--control-vector-scaled FILE:λ`, with the adapter's LoRA (export_for_llama_cpp writes both), then steers like λ
    here (approximately for an o_proj vector, which llama.cpp adds at the end of its layer). model_type /
    layer_count: the base model's config.model_type / num_hidden_layers. Returns the sites left out: those of layer
    0, which llama.cpp cannot carry (it rejects direction.0)."""
    if not steering_mode(mode).exportable:
        exportable = [m.name for m in MODES.values() if m.exportable]
        raise ValueError(f"mode={mode!r}: a control vector holds a fixed direction — export one of {exportable}.")
    deltas = steering_mode(mode).deltas(vectors, units)
    kept = [s for s in vectors.sites if s.layer >= 1]
    if not kept:
        raise ModelError("every steered site is in layer 0, which a llama.cpp control vector cannot carry.")
    layers = control_vector_layers({s: deltas[s.key] for s in kept}, layer_count)
    write_control_vector(path, layers, model_hint_for(model_type), layer_count)
    return [s.key for s in vectors.sites if s.layer < 1]


def export_for_llama_cpp(
    vectors: SteeringVectors, path: str | os.PathLike, mode: str, units: str, config
) -> LlamaCppExport:
    """The mode's λ = 1 vectors in `units` as a control vector at `path`, and the adapter's LoRA as a llama.cpp
    adapter at lora_gguf_path(path). config: the base model's transformers config."""
    text = text_config(config)
    left_out = save_control_vector(vectors, path, mode, units, text.model_type, text.num_hidden_layers)
    lora = write_adapter_lora(vectors, lora_gguf_path(path), config)
    return LlamaCppExport(Path(path), lora, tuple(left_out))
