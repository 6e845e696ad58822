"""Steering vectors as a llama.cpp control vector: the GGUF file that llama.cpp's `--control-vector FILE` (or
`--control-vector-scaled FILE:SCALE`) reads, and reading one back. The vectors belong to base + LoRA: llama_cpp.py
writes the LoRA beside them for `--lora`.

    control_vector_index(site) -> int                    the llama.cpp layer index a residual site's vector goes to
                                                         (the mapping rule and its approximation, in its docstring)
    control_vector_layers(site_vectors, layer_count=None) -> {index: float32 (hidden,)}
        site_vectors: {Site: (hidden,) vector}, e.g. {site: lam * v} from SteeringVectors; vectors of sites that
        map to the same index are summed. Refuses non-residual sites, vectors of different lengths, non-finite
        values, and sites llama.cpp cannot carry (layer 0; layer >= layer_count when given), naming the site.
    write_control_vector(path, directions, model_hint, layer_count=None) -> Path
        GGUF with general.architecture = "controlvector", controlvector.model_hint (str),
        controlvector.layer_count (int32: the number of direction tensors, as llama.cpp's cvector-generator and
        repeng write it) and one F32 1-D tensor "direction.N" per index, in index order; written atomically
        (io.atomic_path: a temp file in the same folder, then os.replace). layer_count (the model's
        config.num_hidden_layers) is only a check: llama.cpp silently ignores direction.N for N >= n_layer.
    read_control_vector(path) -> ControlVector(model_hint, layer_count, directions)
        applies llama.cpp's loader rules (below) and raises ModelError where llama.cpp would skip the file.
    model_hint_for(model_type) -> str                    llama.cpp architecture name of a HF config.model_type

What llama.cpp does with the file (ggml-org/llama.cpp):
    common/common.cpp  common_control_vector_load_one: reads only the tensors (no key, not even the architecture):
        every tensor must be named "direction.<int>" (std::stoi of the text after the first '.'), index >= 1
        ("invalid (zero) direction tensor layer index"), F32, 1-D (ggml_n_dims), all of one length (n_embd);
        tensors of the same index are summed, each times the --control-vector-scaled strength; any bad tensor, or
        none at all, makes it skip the file: it logs "no valid control vector files passed" and generates UNSTEERED
        text with exit code 0 (hence read_control_vector's checks before a file is handed over).
    src/llama-adapter.cpp  llama_adapter_cvec::apply/tensor_for/apply_to: tensors exist for layers 1..n_layer-1
        ("there's never a tensor for layer 0"); the n_embd must equal the model's; by default (common.cpp) the
        range is --control-vector-layer-range 1 n_layer.
    src/models/*.cpp: at the end of decoder layer il (0-based, the same il as blk.il = HF model.layers[il]), after
        the FFN residual add: `cur = build_cvec(cur, il); cb(cur, "l_out", il);`, i.e. direction.il is added to
        the output of layer il, at every position.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from ...foundations.errors import ModelError
from ...foundations.io import atomic_path
from ...runtime.sites import RESIDUAL_MODULES, Site

ARCHITECTURE = "controlvector"
KEY_ARCHITECTURE = "general.architecture"
KEY_MODEL_HINT = f"{ARCHITECTURE}.model_hint"
KEY_LAYER_COUNT = f"{ARCHITECTURE}.layer_count"
TENSOR_PREFIX = "direction"
MIN_INDEX = 1  # llama.cpp rejects direction.0: layer 0 never carries a control vector

# HF config.model_type -> llama.cpp architecture (gguf MODEL_ARCH_NAMES), as convert_hf_to_gguf.py maps the
# *ForCausalLM classes: Mistral and Mixtral convert to the "llama" architecture; Gemma3ForCausalLM (model_type
# gemma3_text) and Gemma3ForConditionalGeneration (gemma3) to "gemma3".
MODEL_HINTS: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
}

_STOI_RE = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")  # what std::stoi accepts at the start of a string
_INT32_MAX = 2**31 - 1


@dataclass
class ControlVector:
    """A control vector file's content: directions[N] is the float32 (hidden,) vector llama.cpp adds to the output
    of decoder layer N (0-based, N >= 1)."""

    model_hint: str
    layer_count: int
    directions: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def hidden_size(self) -> int:
        return int(next(iter(self.directions.values())).shape[0]) if self.directions else 0


def model_hint_for(model_type: str) -> str:
    """The llama.cpp architecture name for a Hugging Face config.model_type (what llama.cpp's cvector-generator
    writes as controlvector.model_hint: the model GGUF's general.architecture); an unknown type is returned
    unchanged."""
    return MODEL_HINTS.get(model_type, model_type)


def control_vector_index(site: Site) -> int:
    """The llama.cpp control-vector layer index for a vector added to the output of `site`: site.layer, for both
    residual-writing modules.

    llama.cpp adds direction.N to the output of decoder layer N (0-based, the HF model.layers[N]), after the
    layer's last residual add (`build_cvec(cur, il)` before `l_out`); it can add nothing anywhere else.
      down_proj of layer L: in a pre-norm decoder (Llama, Mistral, Qwen2, Qwen3) the MLP output is added to the
        residual as the last step of layer L, so adding v to it equals adding v to the output of layer L: exact.
      o_proj of layer L: added to the residual mid-layer, so in the workbench the MLP of layer L sees the shift;
        at the end of layer L it does not. Same index L, an APPROXIMATION (exact only if layer L's MLP were
        linear in its input shift, which it is not).
      Gemma3 applies post_attention_layernorm / post_feedforward_layernorm to the o_proj / down_proj output before
        the residual add, so there the workbench's hook output is normalised and both mappings are approximations.
    Index 0 (a site in layer 0) cannot be carried: control_vector_layers refuses it. Raises ModelError for a site
    outside RESIDUAL_MODULES (its output is not added to the residual stream)."""
    if not isinstance(site, Site):
        raise ModelError(
            f"{site!r} is not a Site: pass {{Site: vector}} (topl_core.runtime.sites.Site, e.g. from "
            "SteeringVectors.sites)."
        )
    if not site.residual:
        raise ModelError(
            f"{site.key}: a control vector adds to the residual stream, and {site.module} does not write to it. "
            f"Export only sites of the residual-writing modules {', '.join(RESIDUAL_MODULES)}."
        )
    return int(site.layer)


def _as_vector(value, what: str) -> np.ndarray:
    try:
        vec = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{what}: not a numeric vector ({e}); pass a 1-D float array of the model's hidden size.")
    if vec.ndim != 1 or vec.size == 0:
        raise ModelError(
            f"{what}: shape {tuple(vec.shape)}; a direction is one 1-D vector of the model's hidden size "
            "(flatten a (1, hidden) array, or pass one vector per site)."
        )
    if not np.all(np.isfinite(vec)):
        raise ModelError(f"{what}: holds NaN or infinite values; recompute the steering vector.")
    return vec


def _check_layer_count(layer_count: int | None) -> int | None:
    if layer_count is None:
        return None
    if isinstance(layer_count, bool) or not isinstance(layer_count, (int, np.integer)) or layer_count < 2:
        raise ModelError(
            f"layer_count={layer_count!r}: pass the model's number of decoder layers (config.num_hidden_layers, "
            "at least 2: llama.cpp carries directions for layers 1..n_layer-1), or None."
        )
    return int(layer_count)


def control_vector_layers(
    site_vectors: Mapping[Site, np.ndarray], layer_count: int | None = None
) -> dict[int, np.ndarray]:
    """{llama.cpp layer index: float32 (hidden,) direction}: each site's vector goes to control_vector_index(site),
    and vectors sharing an index (o_proj and down_proj of one layer) are summed (in float64, then cast).

    Raises ModelError, naming the site, for: a non-residual site; a vector that is not 1-D, empty or non-finite;
    vectors of different lengths (all must be the model's hidden size); a site in layer 0 (llama.cpp rejects
    direction.0 and then skips the whole file); with layer_count (config.num_hidden_layers), a layer >= layer_count
    (llama.cpp would silently drop it). An empty mapping is refused too (llama.cpp skips a file with no tensors)."""
    layer_count = _check_layer_count(layer_count)
    if not site_vectors:
        raise ModelError(
            "No site vectors to export: a control vector needs at least one direction (llama.cpp skips a file "
            "without direction tensors). Pass {Site: vector} for at least one o_proj/down_proj site."
        )
    sums: dict[int, np.ndarray] = {}
    first: tuple[str, int] | None = None
    for site in sorted(site_vectors, key=lambda s: (s.layer, s.module) if isinstance(s, Site) else (-1, "")):
        index = control_vector_index(site)
        vec = _as_vector(site_vectors[site], f"{site.key}")
        if first is None:
            first = (site.key, vec.size)
        elif vec.size != first[1]:
            raise ModelError(
                f"{site.key}: vector of length {vec.size}, but {first[0]} has length {first[1]}. All directions "
                "must have the model's hidden size; mix no vectors of different models."
            )
        if index < MIN_INDEX:
            raise ModelError(
                f"{site.key}: layer {site.layer} cannot be carried by a llama.cpp control vector (llama.cpp adds "
                f"direction.N only for N >= {MIN_INDEX} and skips a file that holds direction.0). Leave the layer-0 "
                "sites out of the export, or steer them in the workbench."
            )
        if layer_count is not None and index >= layer_count:
            raise ModelError(
                f"{site.key}: layer {site.layer} is beyond the model's {layer_count} decoder layers (llama.cpp "
                f"applies direction.N only for N <= {layer_count - 1}). The site belongs to a deeper model: check "
                "the model the vectors were computed on."
            )
        sums[index] = sums[index] + vec if index in sums else vec.copy()
    return {i: sums[i].astype(np.float32) for i in sorted(sums)}


def write_control_vector(
    path: str | os.PathLike,
    directions: Mapping[int, np.ndarray],
    model_hint: str,
    layer_count: int | None = None,
) -> Path:
    """Write `directions` ({index: (hidden,) vector}, e.g. control_vector_layers(...)) as a llama.cpp control vector
    GGUF at `path`, atomically. Writes general.architecture = "controlvector", controlvector.model_hint,
    controlvector.layer_count (int32, the number of direction tensors, as llama.cpp's cvector-generator writes it;
    llama.cpp itself reads no key) and one float32 1-D tensor "direction.N" per index, in index order.

    layer_count: the model's config.num_hidden_layers; when given, an index >= layer_count is refused (llama.cpp
    would silently ignore it). Raises ModelError for no directions, an index < 1 or not an int, a vector that is
    not 1-D / empty / non-finite, vectors of different lengths, or an empty model_hint."""
    import gguf

    layer_count = _check_layer_count(layer_count)
    if not isinstance(model_hint, str) or not model_hint:
        raise ModelError(
            f"model_hint={model_hint!r}: pass the llama.cpp architecture of the model the vectors belong to, e.g. "
            "model_hint_for(model.config.model_type)."
        )
    if not directions:
        raise ModelError(
            "No directions to write: llama.cpp skips a control vector without direction tensors. Pass at least one "
            "{layer index: vector} (control_vector_layers(site_vectors))."
        )
    arrays: dict[int, np.ndarray] = {}
    size: int | None = None
    for index in directions:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ModelError(f"direction key {index!r}: keys are llama.cpp layer indices (int >= {MIN_INDEX}).")
        index = int(index)
        if index < MIN_INDEX:
            raise ModelError(
                f"direction.{index}: llama.cpp adds control vectors only to layers >= {MIN_INDEX} and skips a file "
                "that holds a layer index below it; leave that layer out."
            )
        if layer_count is not None and index >= layer_count:
            raise ModelError(
                f"direction.{index}: the model has {layer_count} decoder layers, so llama.cpp applies direction.N "
                f"only for N <= {layer_count - 1} and would silently drop this one; check the model."
            )
        vec = _as_vector(directions[index], f"direction.{index}")
        if size is None:
            size = vec.size
        elif vec.size != size:
            raise ModelError(
                f"direction.{index}: length {vec.size}, but the other directions have length {size}; llama.cpp "
                "skips a file whose directions differ in length. Use vectors of the model's hidden size only."
            )
        arrays[index] = np.ascontiguousarray(vec, dtype=np.float32)

    path = Path(path)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCHITECTURE)  # adds general.architecture
        try:
            writer.add_string(KEY_MODEL_HINT, model_hint)
            writer.add_int32(KEY_LAYER_COUNT, len(arrays))
            for index in sorted(arrays):
                writer.add_tensor(f"{TENSOR_PREFIX}.{index}", arrays[index])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    return path


def _stoi_index(name: str) -> int:
    """The layer index llama.cpp parses from a tensor name: "direction.<int>" via std::stoi of the text after the
    first '.'; -1 when the name is not a direction or stoi would fail (no digits, out of int range)."""
    prefix, dot, rest = name.partition(".")
    if not dot or prefix != TENSOR_PREFIX:
        return -1
    m = _STOI_RE.match(rest)
    if m is None:
        return -1
    value = int(m.group(1))
    return value if -_INT32_MAX - 1 <= value <= _INT32_MAX else -1


def _field_value(reader, key: str):
    f = reader.get_field(key)
    if f is None or not f.types:
        return None
    return f.contents()


def read_control_vector(path: str | os.PathLike) -> ControlVector:
    """Read a llama.cpp control vector GGUF. Checks general.architecture == "controlvector" (llama.cpp reads no key:
    this refuses other GGUFs such as models or LoRA adapters up front), then every rule of llama.cpp's loader:
    tensors named direction.N with N >= 1, F32, 1-D (trailing dimensions of 1 allowed, as ggml_n_dims counts),
    all of one length, at least one; tensors of the same index are summed, as llama.cpp does.
    model_hint and layer_count are optional in the file (llama.cpp ignores them): "" and the number of distinct
    indices when absent. Raises ModelError for a missing file, a file that is not GGUF, or any broken rule."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such control vector file; check the path (write one with write_control_vector).")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors on bad bytes; mmap on an empty file
        raise ModelError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); it is corrupt or of another format. "
            "Re-export it with write_control_vector."
        ) from e

    arch = _field_value(reader, KEY_ARCHITECTURE)
    if arch != ARCHITECTURE:
        raise ModelError(
            f"{path}: a GGUF with general.architecture={arch!r}, not a control vector ({ARCHITECTURE!r}); it is "
            "probably a model or a LoRA adapter. Pass the file written by write_control_vector or cvector-generator."
        )
    hint = _field_value(reader, KEY_MODEL_HINT)
    if hint is not None and not isinstance(hint, str):
        raise ModelError(f"{path}: {KEY_MODEL_HINT} is {hint!r}, not a string; the file is malformed.")
    count = _field_value(reader, KEY_LAYER_COUNT)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
        raise ModelError(f"{path}: {KEY_LAYER_COUNT} is {count!r}, not an integer; the file is malformed.")

    if not reader.tensors:
        raise ModelError(
            f"{path}: holds no direction tensors (llama.cpp skips such a file); re-export with at least one layer."
        )
    directions: dict[int, np.ndarray] = {}
    size: int | None = None
    for t in reader.tensors:
        index = _stoi_index(t.name)
        if index < 0:
            raise ModelError(
                f"{path}: tensor {t.name!r} is not named direction.<layer> (llama.cpp: invalid/unparsable direction "
                "tensor layer index, and it skips the file); the file is not a control vector."
            )
        if index < MIN_INDEX:
            raise ModelError(
                f"{path}: tensor {t.name!r} has layer index 0, which llama.cpp rejects (it skips the file); layer 0 "
                "cannot carry a control vector. Re-export without it."
            )
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ModelError(
                f"{path}: tensor {t.name!r} is {t.tensor_type.name}, but llama.cpp reads only F32 directions; "
                "re-export it as float32."
            )
        dims = [int(d) for d in t.shape]  # ggml order: ne[0] first
        if not dims or any(d != 1 for d in dims[1:]):
            raise ModelError(
                f"{path}: tensor {t.name!r} has shape {tuple(reversed(dims))}, but a direction must be 1-D "
                "(llama.cpp: invalid (non-1D) direction tensor shape); re-export one (hidden,) vector per layer."
            )
        n = int(t.n_elements)
        if size is None:
            size = n
        elif n != size:
            raise ModelError(
                f"{path}: tensor {t.name!r} has {n} values, but the previous directions have {size} (llama.cpp: "
                "direction tensor does not match previous dimensions); the file mixes models."
            )
        data = np.array(t.data, dtype=np.float32).reshape(-1)  # a copy: the reader's memmap is released with it
        directions[index] = directions[index] + data if index in directions else data
    directions = {i: directions[i] for i in sorted(directions)}
    layer_count = int(count) if count is not None else len(directions)
    return ControlVector(model_hint=hint or "", layer_count=layer_count, directions=directions)
