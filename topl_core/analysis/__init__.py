"""Opening adapters up: LoRA sites, LoRA-A capture and separability (AUROC per layer × module), UMAP of
projections, LoRA-B steering vectors, and the disk cache that every analysis result goes through.

Modules (each documents its public API in its docstring; no streamlit anywhere):
    sites        lora_sites, Site, lora_weights, read_lora_weights
    capture      capture_lora, collect_projections, Projections, random_lora_A
    separability separability, Separability, comparison_table (pure statistics on projections)
    probe        probe_run, run_projections, ProbeSettings (adapter + token set → cached projections and scores)
    umap_view    umap_embedding, run_umap
    steering     steer, SteeringVectors, compute_steering_vectors, build_steering_vectors, SteeringSession
    cache        cached, Codec (JSON, NPZ, PARQUET); records_fingerprint (from topl_core.data.records)
"""

from ..data.records import records_fingerprint
from ..presets import LORA_MODULES
from .cache import JSON, NPZ, PARQUET, cached
from .capture import Projections, capture_lora, collect_projections, random_lora_A
from .probe import ProbeResult, ProbeSettings, probe_run
from .separability import Separability, comparison_table, separability
from .sites import RESIDUAL_MODULES, LoraWeights, Site, lora_sites, lora_weights, read_lora_weights
from .steering import SteeringSession, SteeringVectors, build_steering_vectors, compute_steering_vectors, steer

__all__ = [
    "JSON",
    "NPZ",
    "PARQUET",
    "cached",
    "records_fingerprint",
    "Projections",
    "capture_lora",
    "collect_projections",
    "random_lora_A",
    "ProbeResult",
    "ProbeSettings",
    "Separability",
    "comparison_table",
    "probe_run",
    "separability",
    "LORA_MODULES",
    "RESIDUAL_MODULES",
    "LoraWeights",
    "Site",
    "lora_sites",
    "lora_weights",
    "read_lora_weights",
    "SteeringSession",
    "SteeringVectors",
    "build_steering_vectors",
    "compute_steering_vectors",
    "steer",
]
