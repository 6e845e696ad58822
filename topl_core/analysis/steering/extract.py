"""Extracting steering vectors (vectors.SteeringVectors) from an adapter: per residual-writing site, μ+ / μ− of the
LoRA-A projections of good and bad tokens, v = scaling · B (μ+ − μ−) for the top-k sites by AUROC, and the merged
model's outputs there (site_outputs: the diff-mean control and the unit of normalised λ). The functions are listed
in vectors.py's docstring."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from typing import Mapping, Sequence

import numpy as np
import torch

from ...data.records import records_fingerprint
from ...foundations.errors import ModelError
from ...hardware.precision import resolve_precision, to_numpy
from ...inference.generate import load_merged
from ...models.loading import LoadedModel, ModelSpec
from ...runtime.sites import (
    RESIDUAL_MODULES,
    LoraWeights,
    Site,
    active_adapter_name,
    lora_sites,
    lora_weights,
    read_lora_weights,
    site_module,
    sort_sites,
)
from ...runtime.vectors import SteeringVectors
from ...training.adapters import open_adapter
from ..cache import cached, json_codec
from ..lora_a.capture import DEFAULT_SET, Projections
from ..lora_a.probe import STEERING_TOKEN_RECORDS, ProbeSettings, labelled_split, run_projections
from ..lora_a.separability import separability


def _aurocs(aurocs) -> dict[str, float]:
    if hasattr(aurocs, "scores"):  # a Separability
        return {s.site.key: float(s.cv_auroc) for s in aurocs.scores}
    return {str(k.key if isinstance(k, Site) else k): float(v) for k, v in aurocs.items()}


def rank_sites(
    sites: Sequence[Site], aurocs: Mapping[str, float], top_k: int, modules: Sequence[str] = RESIDUAL_MODULES
) -> list[Site]:
    """The top_k sites among `modules` by AUROC (descending; NaN last; ties by layer then module order)."""
    cand = [s for s in sort_sites(sites) if s.module in modules and s.key in aurocs]
    cand.sort(key=lambda s: -aurocs[s.key] if not math.isnan(aurocs[s.key]) else math.inf)
    return cand[:top_k]


def compute_steering_vectors(
    weights: Mapping[Site, LoraWeights],
    proj: Projections,
    aurocs,
    top_k: int = 4,
    modules: Sequence[str] = RESIDUAL_MODULES,
    outputs: Projections | None = None,
    **meta,
) -> SteeringVectors:
    """v = scaling · B (μ+ − μ−) for the top_k sites (see the module docstring). `outputs`: the merged model's
    outputs at (at least) the chosen sites on the same labelled tokens (site_outputs): with them the vectors carry
    the diff-mean control and the mean output norm that normalised λ needs."""
    bad_modules = [m for m in modules if m not in RESIDUAL_MODULES]
    if bad_modules:
        raise ValueError(
            f"modules={bad_modules}: only {RESIDUAL_MODULES} write to the residual stream and can be steered there."
        )
    if top_k < 1:
        raise ValueError(f"top_k={top_k}: steer at least one site.")
    scores = _aurocs(aurocs)
    p = proj.labelled()
    good, bad = p.labels == 1, p.labels == 0
    if not good.any() or not bad.any():
        raise ValueError(
            f"steering needs good and bad tokens; the token set has {int(good.sum())} good, {int(bad.sum())} bad."
        )
    chosen = rank_sites([s for s in p.sites if s in weights], scores, top_k, modules)
    if not chosen:
        raise ValueError(f"no {'/'.join(modules)} site with an AUROC among the projections' sites: nothing to steer.")
    vectors, mu_g, mu_b, scaling = {}, {}, {}, {}
    for s in chosen:
        w = weights[s]
        X = torch.from_numpy(p[s]).double()
        g, b = X[torch.from_numpy(good)].mean(0), X[torch.from_numpy(bad)].mean(0)
        v = w.scaling * (w.B.double() @ (g - b))
        vectors[s.key] = v.float().numpy()
        mu_g[s.key], mu_b[s.key] = g.float().numpy(), b.float().numpy()
        scaling[s.key] = float(w.scaling)
    diff_mean, output_norm = {}, {}
    if outputs is not None:
        o = outputs.labelled()
        if not np.array_equal(o.labels, p.labels):
            raise ValueError("outputs: the site outputs were captured on other tokens than the projections.")
        for s in chosen:
            Y = o[s].astype(np.float64)
            diff_mean[s.key] = (Y[good].mean(0) - Y[bad].mean(0)).astype(np.float32)
            output_norm[s.key] = float(np.linalg.norm(Y, axis=1).mean())
    return SteeringVectors(
        tuple(chosen),
        vectors,
        mu_g,
        mu_b,
        {s.key: scores[s.key] for s in chosen},
        scaling,
        n_good=int(good.sum()),
        n_bad=int(bad.sum()),
        diff_mean=diff_mean,
        output_norm=output_norm,
        **meta,
    )


def site_outputs(
    lm: LoadedModel, records, sites: Sequence[Site], settings: ProbeSettings, progress=None
) -> Projections:
    """The merged model's outputs at residual-writing `sites` (o_proj / down_proj: Linear layers) on the labelled
    tokens of `records`, captured as "projections" onto the merged weight W (x·Wᵀ + bias = the module's output),
    with the same encoding and token selection as the LoRA-A projections."""
    weights, bias = {}, {}
    for s in sites:
        m = site_module(lm.model, s)
        if hasattr(m, "base_layer") or not isinstance(m, torch.nn.Linear):
            raise ModelError(
                f"{s.key}: site outputs are read from a merged model's Linear layer, not {type(m).__name__}."
            )
        weights[s] = m.weight.detach()
        if m.bias is not None:
            bias[s.key] = to_numpy(m.bias)
    out = settings.collect(lm.model, lm.tokenizer, records, "labelled", sites=sites, weights=weights, progress=progress)
    for k, b in bias.items():
        out.values[k] = out.values[k] + b
    return out


def steering_vectors_from_model(
    model: torch.nn.Module, proj: Projections, aurocs, top_k: int = 4, adapter: str | None = None, **kw
) -> SteeringVectors:
    """compute_steering_vectors with A/B/scaling read from the PEFT model for `adapter` (default: active)."""
    adapter = adapter or active_adapter_name(model)
    weights = {s: lora_weights(model, s, adapter) for s in lora_sites(model) if s in set(proj.sites)}
    return compute_steering_vectors(weights, proj, aurocs, top_k, **kw)


def build_steering_vectors(
    adapter,
    records,
    settings=None,
    top_k: int = 4,
    base: LoadedModel | None = None,
    use_cache: bool = True,
    progress=None,
    merged: LoadedModel | None = None,
) -> SteeringVectors:
    """Steering vectors of an adapter (a run, a PEFT folder, a hub id) from a labelled token set: projections
    (cached), per-site cv AUROC of the residual-writing sites, A/B/scaling from the adapter's files, and the merged
    model's outputs at the chosen sites (`merged`, loaded when not given) for the diff-mean control and λ's unit.

    Example: ``vectors = build_steering_vectors(adapter, labelled_split(adapter, limit=16), top_k=4)``"""
    adapter = open_adapter(adapter)
    # no random-A control by default: vectors never read it (and the pages' shipped results are keyed without it)
    settings = (settings or ProbeSettings(random_control=False)).resolved(adapter)

    def compute() -> SteeringVectors:
        proj = run_projections(adapter, records, settings, base, use_cache, progress)[DEFAULT_SET]
        residual = [s for s in proj.sites if s.residual]
        sub = Projections(
            tuple(residual),
            {s.key: proj[s] for s in residual},
            proj.labels,
            proj.record_ids,
            proj.positions,
            proj.tokens,
            proj.doc_ids,
        )
        sep = separability(sub, adapter.name, settings.folds, settings.seed, n_boot=10)
        weights = read_lora_weights(adapter.path)
        chosen = rank_sites([s for s in residual if s in weights], _aurocs(sep), top_k)
        lm = merged or load_merged(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device), adapter)
        outputs = site_outputs(lm, records, chosen, settings) if chosen else None
        return compute_steering_vectors(
            weights,
            proj,
            sep,
            top_k,
            outputs=outputs,
            base_model=adapter.base_model,
            base_fingerprint=adapter.base_fingerprint,
            adapter_fingerprint=adapter.fingerprint(),
            adapter_path=str(adapter.path),
            extra={"auroc_column": "cv_auroc", "tokens": "labelled", "created": time.time()},
        )

    key = {
        "analysis": "steering_vectors",
        "version": 2,  # 2: with the merged model's site outputs (diff-mean control, normalised λ)
        "settings": asdict(settings),
        "records": records_fingerprint(records),
        "top_k": top_k,
    }
    vectors = cached(
        "steering_vectors",
        key,
        compute,
        json_codec(SteeringVectors.to_json, SteeringVectors.from_json),
        adapter=adapter,
        enabled=use_cache,
    )
    return replace(vectors, adapter_path=str(adapter.path))  # a cached entry may come from another checkout


def page_vectors(adapter, precision: str = "auto", use_cache: bool = True) -> SteeringVectors:
    """The vectors the Steering page opens on, and the service's: from the first STEERING_TOKEN_RECORDS labelled
    records of the validation split of the adapter's data (cached in cache/analysis/, shipped for the demo adapters)."""
    adapter = open_adapter(adapter)
    settings = ProbeSettings(random_control=False, precision=resolve_precision(precision, adapter.device))
    records = labelled_split(adapter, "val", STEERING_TOKEN_RECORDS)
    return build_steering_vectors(adapter, records, settings, use_cache=use_cache)
