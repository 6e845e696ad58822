"""What a reader sees of a set of steering vectors: the steered sites as a table, and every export in one zip.

site_table(vectors) -> DataFrame        per site: AUROC, scaling, ‖v‖, mean ‖output‖, ‖diff-mean‖,
                                        cos(v, diff-mean), the raw λ of one normalised unit
export_bundle(vectors, config) -> ExportBundle
    steering_vectors.safetensors + steering.json, a llama.cpp control vector per exportable mode and the LoRA as
    a llama.cpp adapter, zipped
"""

from __future__ import annotations

import io
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...runtime.modes import MODES
from ...runtime.vectors import SteeringVectors
from .llama_cpp import save_control_vector, text_config, write_adapter_lora


def site_table(vectors: SteeringVectors) -> pd.DataFrame:
    """One row per steered site: how it separates (AUROC), its vector's length against the site's outputs, how the
    LoRA-B vector lines up with the diff-mean control, and what one unit of normalised λ is in the paper's raw λ."""
    norms = vectors.norms()
    per_unit = vectors.unit_factor(MODES["vector"].directions(vectors))
    rows = []
    for s in vectors.sites:
        v, dm = vectors.vectors[s.key], vectors.diff_mean[s.key]
        dm_norm = float(np.linalg.norm(dm))
        rows.append(
            {
                "site": s.key,
                "AUROC": vectors.auroc[s.key],
                "scaling": vectors.scaling[s.key],
                "‖v‖": norms[s.key],
                "mean ‖output‖": vectors.output_norm[s.key],
                "‖diff-mean‖": dm_norm,
                "cos(v, diff-mean)": float(v @ dm / max(norms[s.key] * dm_norm, 1e-30)),
                "raw λ per unit": per_unit[s.key],
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ExportBundle:
    """A zip of the vectors and their control vectors; `left_out`: sites no control vector can carry (layer 0)."""

    data: bytes
    files: tuple[str, ...]
    left_out: tuple[str, ...]


def export_bundle(vectors: SteeringVectors, config) -> ExportBundle:
    """The vectors (SteeringVectors.save), per exportable mode `<mode>.gguf`: λ = 1 in normalised units as a
    llama.cpp control vector, and `lora.gguf`: the adapter's LoRA for llama.cpp's --lora (llama_cpp.py), in one
    zip. config: the base model's transformers config."""
    buf, left_out = io.BytesIO(), []
    text = text_config(config)
    with tempfile.TemporaryDirectory() as d:
        vectors.save(d)
        for mode in (m.name for m in MODES.values() if m.exportable):
            gguf = Path(d) / f"{mode}.gguf"
            left_out = save_control_vector(vectors, gguf, mode, "normalised", text.model_type, text.num_hidden_layers)
        write_adapter_lora(vectors, Path(d) / "lora.gguf", config)  # once: every mode's vector belongs to it
        files = sorted(Path(d).iterdir())
        with zipfile.ZipFile(buf, "w") as z:
            for f in files:
                z.write(f, f.name)
    return ExportBundle(buf.getvalue(), tuple(f.name for f in files), tuple(left_out))
