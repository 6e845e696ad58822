"""The paper's "LoRA-A as an indicator of OOD generalization" table: per adapter, LoRA-A AUROC mean ± std on one
labelled token set (with the random-init A control row) beside its merged model's ID and OOD factuality and mean
sentence count, and how the AUROC ranks with factuality across the adapters (Spearman ρ).

    factuality_by_adapter(adapters, cfg) -> DataFrame     id_factuality, ood_factuality, sentences per adapter name
    factuality_columns(per_doc) -> DataFrame               the same from an evaluation's per-document rows
    indicator_table(separabilities, factuality, control) -> (DataFrame, {"ood_factuality": ρ, "id_factuality": ρ})
    rho_interval(site_aurocs, ood_scores, n, seed) -> {"lo", "hi", "positive"}   how far ρ moves under the CIs

Separability comes from `probe.probe_run`, factuality from `evaluation.evaluate` (the merged model's summaries,
sentence protocol, the configured scorer): both cached on disk, so a second table is instant.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ..lora_a.separability import Separability, comparison_table
from .config import EvalConfig, ProgressFn, Variant
from .evaluate import evaluate, results_table

FACTUALITY_COLUMNS = ("id_factuality", "ood_factuality", "sentences")
MIN_ADAPTERS_FOR_RHO = 3  # a rank correlation of two points is ±1 whatever they are


def factuality_by_adapter(
    adapters: Mapping[str, object], cfg: EvalConfig = EvalConfig(), progress: ProgressFn | None = None, use_cache=True
):
    """The merged model of every adapter (name → anything open_adapter opens) evaluated on cfg's ID and OOD
    documents: a DataFrame indexed by name with id_factuality, ood_factuality (sentence protocol) and sentences."""
    variants = [Variant.merged(adapter, name=name) for name, adapter in adapters.items()]
    return factuality_columns(evaluate(variants, cfg, progress, use_cache, measure_quality=False).per_doc)


def factuality_columns(per_doc):
    """id_factuality, ood_factuality (sentence protocol) and sentences per variant name of an evaluation's rows."""
    table = results_table(per_doc, "sentence")
    return table.rename(columns={"ID": "id_factuality", "OOD": "ood_factuality"})[list(FACTUALITY_COLUMNS)]


def indicator_table(
    separabilities: Mapping[str, Separability], factuality, control: Separability | None = None
) -> tuple[object, dict[str, float]]:
    """comparison_table's rows with the factuality columns joined by name, and Spearman ρ between LoRA-A mean AUROC
    and each factuality column over the adapters (the control row left out; NaN below MIN_ADAPTERS_FOR_RHO or when
    a column is constant)."""
    table = comparison_table(separabilities, factuality["ood_factuality"].to_dict(), control)
    for column in ("id_factuality", "sentences"):
        table[column] = table["method"].map(factuality[column].to_dict()).astype(float)
    adapters = table[table["method"].isin(list(separabilities))].dropna(subset=["ood_factuality"])
    rho = {
        column: float(adapters["mean"].corr(adapters[column], method="spearman"))
        if len(adapters) >= MIN_ADAPTERS_FOR_RHO and adapters["mean"].nunique() > 1 and adapters[column].nunique() > 1
        else math.nan  # a rank correlation with a constant column is undefined
        for column in ("ood_factuality", "id_factuality")
    }
    return table, rho


def rho_interval(
    site_aurocs: Mapping[str, Sequence[float]],
    ood_scores: Mapping[str, Sequence[float]],
    n: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """How far Spearman ρ between the methods' mean LoRA-A AUROC and their mean OOD factuality could move under
    their uncertainty: `n` bootstrap draws, each resampling every method's sites (its separability mean) and the OOD
    documents — the same documents for every method (`ood_scores[name]`: per-document scores in one document order),
    so the factuality comparison stays paired. Returns the 2.5 and 97.5 percentiles of ρ and the share of draws
    with ρ > 0 (NaN below MIN_ADAPTERS_FOR_RHO methods)."""
    from scipy.stats import rankdata

    names = [k for k in site_aurocs if k in ood_scores]
    if len(names) < MIN_ADAPTERS_FOR_RHO:
        return {"lo": math.nan, "hi": math.nan, "positive": math.nan}
    rng = np.random.default_rng(seed)
    sites = {k: np.asarray([a for a in site_aurocs[k] if not math.isnan(a)], dtype=np.float64) for k in names}
    docs = np.asarray([ood_scores[k] for k in names], dtype=np.float64)  # methods × documents
    picks = rng.integers(0, docs.shape[1], size=(n, docs.shape[1]))
    fact = docs[:, picks].mean(axis=2)  # methods × draws
    sep = np.stack([v[rng.integers(0, len(v), size=(n, len(v)))].mean(axis=1) for v in sites.values()])
    rs, rf = (rankdata(x, axis=0) - (len(names) + 1) / 2 for x in (sep, fact))  # Spearman: Pearson of ranks
    with np.errstate(invalid="ignore", divide="ignore"):
        rhos = (rs * rf).sum(0) / np.sqrt((rs**2).sum(0) * (rf**2).sum(0))
    rhos = rhos[~np.isnan(rhos)]  # a draw whose means all tie has no ρ
    if not len(rhos):
        return {"lo": math.nan, "hi": math.nan, "positive": math.nan}
    lo, hi = np.percentile(rhos, [2.5, 97.5])
    return {"lo": float(lo), "hi": float(hi), "positive": float((rhos > 0).mean())}
