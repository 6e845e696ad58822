"""LoRA-B steering vectors (docs/design.md §2): v = scaling · B (μ+ − μ−) at the top-k residual-writing sites, plus
the merged model's outputs at those sites (the diff-mean control and the unit of normalised λ). This module holds the
value and its files; extract.py computes them from an adapter:

    compute_steering_vectors(weights, proj, aurocs, top_k=4, modules=("o_proj", "down_proj"), **meta)
        -> SteeringVectors
        weights: {Site: LoraWeights} (lora_weights(peft_model, site, adapter) or read_lora_weights(run));
        proj: Projections of the same adapter's A·x with token labels; aurocs: Separability or {site key: AUROC}.
        μ+ / μ− = mean A-projection (r-dim) of good / bad tokens; sites ranked by AUROC (NaN last), top_k kept.
    steering_vectors_from_model(peft_model, proj, aurocs, top_k=4, adapter=None, ...) -> SteeringVectors
        the same with A/B/scaling read from PEFT (lora_A[adapter], lora_B[adapter], scaling[adapter]).
    build_steering_vectors(run, records, settings=None, top_k=4, base=None, use_cache=True) -> SteeringVectors
        projections cached, AUROC from cv_auroc; settings None: ProbeSettings(random_control=False)
    SteeringVectors.save(directory) / SteeringVectors.load(directory)
        steering_vectors.safetensors (vector/<key>, mu_good/<key>, mu_bad/<key>) + steering.json (base model, base
        and adapter fingerprints, sites with AUROC and ‖v‖, formula).
    SteeringVectors.in_units(raw, units)   per site, what λ = 1 adds along the directions `raw` (directions.py) in
        normalised or raw units; SteeringVectors.unit_factor(raw): the raw λ that normalised λ = 1 stands for

The bottom floor of steering: values (this module, directions.py, steered_text.py) → hooks.py → gate.py → actions.py
→ modes.py → session.py. Applying them: modes.steer (a context manager) and session.SteeringSession.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from ..foundations.errors import ModelError
from ..foundations.io import save_tensors, write_json
from .sites import LoraWeights, Site, read_lora_weights

# Normalised λ: |λ| = 1 adds, at each steered site, a vector whose norm is UNIT_FRACTION × that site's mean output
# norm on the token set (the same norm for every adding mode: only the direction differs between them).
UNIT_FRACTION = 0.1
UNITS: tuple[str, ...] = ("normalised", "raw")
UNITS_DOC = (
    f"normalised: lambda = 1 adds {UNIT_FRACTION:g} x the site's mean output norm (output_norm) along the mode's "
    "direction; raw: lambda multiplies the stored vector (the paper's formula); modes that do not add a direction "
    "ignore it"
)
FORMULA = "v = scaling * B @ (mu_good - mu_bad); output += lambda * v"
VECTORS_FILE = "steering_vectors.safetensors"
META_FILE = "steering.json"


@dataclass(frozen=True)
class SteeringVectors:
    """Steering vectors of one adapter. Arrays are float32; vectors[k] is (d_out,), mu_*[k] is (r,).

    Example: ``vectors.save("out/vectors"); SteeringVectors.load("out/vectors").auroc``"""

    sites: tuple[Site, ...]
    vectors: dict[str, np.ndarray]
    mu_good: dict[str, np.ndarray]
    mu_bad: dict[str, np.ndarray]
    auroc: dict[str, float]
    scaling: dict[str, float]
    base_model: str | None = None
    base_fingerprint: str | None = None
    adapter_fingerprint: str | None = None
    adapter_path: str | None = None
    n_good: int = 0
    n_bad: int = 0
    extra: dict = field(default_factory=dict)
    # the merged model's site outputs on the same token set: mean good − mean bad output (the diff-mean control)
    # and the mean output norm (the unit of normalised λ); empty for vectors exported before they existed
    diff_mean: dict[str, np.ndarray] = field(default_factory=dict)
    output_norm: dict[str, float] = field(default_factory=dict)

    def norms(self) -> dict[str, float]:
        return {k: float(np.linalg.norm(v)) for k, v in self.vectors.items()}

    def unit_factor(self, raw: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Per site, the raw λ that normalised λ = 1 stands for along the directions `raw` (a mode's, at raw λ = 1):
        UNIT_FRACTION · (mean output norm) / ‖raw vector‖."""
        self.require_outputs()
        return {
            k: float(UNIT_FRACTION * self.output_norm[k] / max(float(np.linalg.norm(v)), 1e-30)) for k, v in raw.items()
        }

    def in_units(self, raw: Mapping[str, np.ndarray], units: str = "normalised") -> dict[str, np.ndarray]:
        """Per site, what λ = 1 adds to the site's output along the directions `raw` in `units` (float32)."""
        if units == "raw":
            return {k: np.asarray(v, np.float32) for k, v in raw.items()}
        factor = self.unit_factor(raw)
        return {k: (np.asarray(v, np.float64) * factor[k]).astype(np.float32) for k, v in raw.items()}

    def adapter_lora(self) -> dict[Site, LoraWeights]:
        """Every LoRA pair of the adapter these vectors came from (what a scaling mode scales)."""
        if not self.adapter_path:
            raise ModelError(
                "these steering vectors name no adapter folder: a mode that scales the update cannot read its A and B "
                "(pass lora= to steer, or recompute the vectors from the adapter)."
            )
        return read_lora_weights(self.adapter_path)

    def require_outputs(self) -> "SteeringVectors":
        if not self.output_norm or not self.diff_mean:
            raise ModelError(
                "these steering vectors carry no site-output statistics (exported by an older version): normalised "
                "λ and the diff-mean control need them — recompute the vectors (python -m topl_core steer --export)."
            )
        return self

    def metadata(self) -> dict:
        norms = self.norms()
        return {
            "formula": FORMULA,
            "base_model": self.base_model,
            "base_fingerprint": self.base_fingerprint,
            "adapter_fingerprint": self.adapter_fingerprint,
            "adapter_path": self.adapter_path,
            "units": UNITS_DOC,
            "n_good": self.n_good,
            "n_bad": self.n_bad,
            "sites": [
                {
                    **s.to_json(),
                    "key": s.key,
                    "auroc": self.auroc[s.key],
                    "scaling": self.scaling[s.key],
                    "norm": norms[s.key],
                    **({"output_norm": self.output_norm[s.key]} if s.key in self.output_norm else {}),
                }
                for s in self.sites
            ],
            "extra": self.extra,
        }

    def save(self, directory: str | Path) -> Path:
        """Write steering_vectors.safetensors + steering.json (atomically) into `directory`."""
        d = Path(directory)
        tensors = {}
        for s in self.sites:
            tensors[f"vector/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.vectors[s.key], np.float32))
            tensors[f"mu_good/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.mu_good[s.key], np.float32))
            tensors[f"mu_bad/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.mu_bad[s.key], np.float32))
            if s.key in self.diff_mean:
                tensors[f"diff_mean/{s.key}"] = torch.from_numpy(
                    np.ascontiguousarray(self.diff_mean[s.key], np.float32)
                )
        meta = self.metadata()
        save_tensors(d / VECTORS_FILE, tensors, {"topl_steering": json.dumps(meta)})
        write_json(d / META_FILE, meta)
        return d

    @classmethod
    def load(cls, directory: str | Path) -> "SteeringVectors":
        from safetensors.torch import load_file

        d = Path(directory)
        if not (d / VECTORS_FILE).exists() or not (d / META_FILE).exists():
            raise ModelError(
                f"{d}: no {VECTORS_FILE} + {META_FILE}; export vectors with `python -m topl_core steer --export {d}`."
            )
        meta = json.loads((d / META_FILE).read_text())
        t = load_file(d / VECTORS_FILE)
        sites = tuple(Site.from_json(s) for s in meta["sites"])
        try:
            get = lambda prefix: {s.key: t[f"{prefix}/{s.key}"].float().numpy() for s in sites}  # noqa: E731
            diff_mean = get("diff_mean") if any(k.startswith("diff_mean/") for k in t) else {}
            return cls._from_parts(meta, get("vector"), get("mu_good"), get("mu_bad"), diff_mean)
        except KeyError as e:
            raise ModelError(
                f"{d / VECTORS_FILE}: missing tensor {e}; the export is incomplete — export it again."
            ) from e

    def to_json(self) -> dict:
        """Metadata and arrays as JSON (the analysis cache; float32 values round-trip exactly through JSON)."""
        arrays = lambda d: {k: np.asarray(v, np.float32).tolist() for k, v in d.items()}  # noqa: E731
        return {
            **self.metadata(),
            "vectors": arrays(self.vectors),
            "mu_good": arrays(self.mu_good),
            "mu_bad": arrays(self.mu_bad),
            "diff_mean": arrays(self.diff_mean),
        }

    @classmethod
    def from_json(cls, d: dict) -> "SteeringVectors":
        arrays = lambda m: {k: np.asarray(v, np.float32) for k, v in m.items()}  # noqa: E731
        return cls._from_parts(
            d, arrays(d["vectors"]), arrays(d["mu_good"]), arrays(d["mu_bad"]), arrays(d.get("diff_mean", {}))
        )

    @classmethod
    def _from_parts(cls, meta: dict, vectors: dict, mu_good: dict, mu_bad: dict, diff_mean: dict) -> "SteeringVectors":
        return cls(
            sites=tuple(Site.from_json(s) for s in meta["sites"]),
            vectors=vectors,
            mu_good=mu_good,
            mu_bad=mu_bad,
            auroc={s["key"]: float(s["auroc"]) for s in meta["sites"]},
            scaling={s["key"]: float(s["scaling"]) for s in meta["sites"]},
            base_model=meta.get("base_model"),
            base_fingerprint=meta.get("base_fingerprint"),
            adapter_fingerprint=meta.get("adapter_fingerprint"),
            adapter_path=meta.get("adapter_path"),
            n_good=int(meta.get("n_good", 0)),
            n_bad=int(meta.get("n_bad", 0)),
            extra=meta.get("extra", {}),
            diff_mean=diff_mean,
            output_norm={s["key"]: float(s["output_norm"]) for s in meta["sites"] if "output_norm" in s},
        )
