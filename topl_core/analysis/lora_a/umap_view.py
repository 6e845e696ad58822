"""UMAP of one site's LoRA-A projections (or of its raw inputs x, i.e. hidden states), colored by label.

    umap_embedding(proj, site, source="projection", n_neighbors=15, min_dist=0.1, seed=0, max_points=4000,
                   standardize=True) -> pandas.DataFrame with columns x, y, label, token, record_id, position

    run_umap(run, records, site, settings=None, source="projection", ..., base=None, use_cache=True) -> DataFrame
        the same for a run on a token set, cached as parquet under cache/analysis/umap/.

`source="projection"` embeds the (n, r) A·x values; `source="hidden"` embeds the site's input x, which must have
been captured with keep_inputs=[site.key]. Unlabelled tokens are kept (label −1) so a page can grey them out.
Above max_points tokens, a seeded random subset is embedded (UMAP is slow on 2 CPU cores); the chosen rows are
stratified only by chance, so the label mix of the subset matches the token set in expectation.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ...data.records import records_fingerprint
from ...models.loading import ModelSpec, load_model
from ...runtime.sites import Site, lora_sites
from ...training.adapters import load_adapter, open_adapter
from ..cache import PARQUET, cached
from .capture import Projections
from .probe import ProbeSettings, run_projections


def umap_embedding(
    proj: Projections,
    site: Site | str,
    source: Literal["projection", "hidden"] = "projection",
    n_neighbors: int = 15,
    min_dist: float = 0.1,
    seed: int = 0,
    max_points: int = 4000,
    standardize: bool = True,
):
    import pandas as pd

    key = site.key if isinstance(site, Site) else site
    if source == "projection":
        X = proj[key]
    elif source == "hidden":
        if key not in proj.inputs:
            raise ValueError(
                f"umap_embedding: no hidden states for {key}; capture them with keep_inputs=[{key!r}] "
                "(collect_projections(..., keep_inputs=...)), or use source='projection'."
            )
        X = proj.inputs[key]
    else:
        raise ValueError(f"source={source!r}: choose 'projection' (A·x) or 'hidden' (the site's input x).")
    n = len(X)
    if n < 3:
        raise ValueError(f"umap_embedding: {n} tokens at {key}; UMAP needs at least 3.")
    rows = np.arange(n)
    if n > max_points:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=max_points, replace=False))
    X = np.asarray(X[rows], dtype=np.float64)
    if standardize:
        X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    xy = _fit_umap(X, min(n_neighbors, len(rows) - 1), min_dist, seed)
    return pd.DataFrame(
        {
            "x": xy[:, 0].astype(np.float32),
            "y": xy[:, 1].astype(np.float32),
            "label": proj.labels[rows].astype(int),
            "token": proj.tokens[rows].astype(str),
            "record_id": proj.record_ids[rows].astype(str),
            "position": proj.positions[rows].astype(int),
        }
    )


def _fit_umap(X: np.ndarray, n_neighbors: int, min_dist: float, seed: int) -> np.ndarray:
    import umap

    reducer = umap.UMAP(n_components=2, n_neighbors=n_neighbors, min_dist=min_dist, random_state=seed, n_jobs=1)
    return reducer.fit_transform(X)


def warm_up() -> None:
    """Fit a UMAP once on random data, as umap_embedding fits one: numba compiles UMAP's and pynndescent's kernels
    on first use (tens of seconds on 2 cores: docs/performance.md, "Figures behind the code's choices") and keeps
    those it may cache under the virtualenv, so scripts/setup.sh calls this once and the first UMAP view in the app
    costs that much less."""
    _fit_umap(np.random.default_rng(0).normal(size=(300, 8)), 10, 0.1, 0)


def run_umap(
    adapter,
    records,
    site: Site | str,
    settings=None,
    source: Literal["projection", "hidden"] = "projection",
    n_neighbors: int = 15,
    min_dist: float = 0.1,
    seed: int = 0,
    max_points: int = 4000,
    base=None,
    use_cache: bool = True,
):
    """umap_embedding for a run's site on a labelled token set, cached as parquet (keyed by settings, token set,
    adapter and base fingerprints). Projections come from the cached run_projections; hidden states are
    captured for that one site only (the forward stops after its layer)."""
    adapter = open_adapter(adapter)
    settings = (settings or ProbeSettings()).resolved(adapter)
    key_name = site.key if isinstance(site, Site) else site
    key = {
        "analysis": "umap",
        "site": key_name,
        "source": source,
        "n_neighbors": n_neighbors,
        "min_dist": min_dist,
        "seed": seed,
        "max_points": max_points,
        "capture": settings.capture_key(),
        "records": records_fingerprint(records),
    }

    def compute():
        if source == "projection":
            proj = run_projections(adapter, records, settings, base, use_cache)["lora"]
        else:
            lm = base or load_model(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device))
            model = load_adapter(lm, adapter)
            target = [s for s in lora_sites(model) if s.key == key_name]
            if not target:
                raise ValueError(f"run_umap: {adapter.path} has no LoRA site {key_name!r}.")
            proj = settings.collect(model, lm.tokenizer, records, sites=target, keep_inputs=[key_name])
        return umap_embedding(proj, key_name, source, n_neighbors, min_dist, seed, max_points)

    return cached("umap", key, compute, PARQUET, adapter=adapter, enabled=use_cache)
