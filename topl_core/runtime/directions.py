"""The directions a steering mode acts along, per site, from the steering vectors (a mode of modes.MODE_TABLE names
one): the paper's LoRA-B vector, and the controls at the same sites.

    lora_b_direction(vectors)     scaling · B(μ+ − μ−)
    diff_mean_direction(vectors)  the merged model's mean site output of good tokens minus that of bad tokens
    random_direction(vectors)     a seeded random direction per site with the LoRA-B vector's norm
"""

from __future__ import annotations

import hashlib
from typing import Callable, Mapping

import numpy as np

from .vectors import SteeringVectors

Direction = Callable[[SteeringVectors], Mapping[str, np.ndarray]]
RANDOM_SEED = 0  # the random control's directions are seeded per site from this and the site key


def lora_b_direction(vectors: SteeringVectors) -> Mapping[str, np.ndarray]:
    """The paper's steering vector per site: scaling · B(μ+ − μ−)."""
    return vectors.vectors


def diff_mean_direction(vectors: SteeringVectors) -> Mapping[str, np.ndarray]:
    """The merged model's mean site output of good tokens minus that of bad tokens."""
    vectors.require_outputs()
    return vectors.diff_mean


def random_direction(vectors: SteeringVectors) -> Mapping[str, np.ndarray]:
    """A seeded random direction per site with the LoRA-B vector's norm."""
    out = {}
    for s in vectors.sites:
        v = vectors.vectors[s.key]
        seed = int.from_bytes(hashlib.sha256(f"{RANDOM_SEED}|{s.key}".encode()).digest()[:4], "little")
        r = np.random.default_rng(seed).standard_normal(v.shape)
        out[s.key] = (r * (np.linalg.norm(v) / np.linalg.norm(r))).astype(np.float32)
    return out
