"""The paper's "LoRA-A as an indicator of OOD generalization" table: per adapter, LoRA-A AUROC mean ± std on one
labelled token set (with the random-init A control row) beside its merged model's ID and OOD factuality and mean
sentence count, and how the AUROC ranks with factuality across the adapters (Spearman ρ).

    factuality_by_adapter(adapters, cfg) -> DataFrame     id_factuality, ood_factuality, sentences per adapter name
    indicator_table(separabilities, factuality, control) -> (DataFrame, {"ood_factuality": ρ, "id_factuality": ρ})

Separability comes from `probe.probe_run`, factuality from `evaluation.evaluate` (the merged model's summaries,
sentence protocol, the configured scorer): both cached on disk, so a second table is instant.
"""

from __future__ import annotations

import math
from typing import Mapping

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
    result = evaluate(variants, cfg, progress, use_cache, measure_quality=False)
    table = results_table(result.per_doc, "sentence")
    return table.rename(columns={"ID": "id_factuality", "OOD": "ood_factuality"})[list(FACTUALITY_COLUMNS)]


def indicator_table(
    separabilities: Mapping[str, Separability], factuality, control: Separability | None = None
) -> tuple[object, dict[str, float]]:
    """comparison_table's rows with the factuality columns joined by name, and Spearman ρ between LoRA-A mean AUROC
    and each factuality column over the adapters (the control row left out; NaN below MIN_ADAPTERS_FOR_RHO)."""
    table = comparison_table(separabilities, factuality["ood_factuality"].to_dict(), control)
    for column in ("id_factuality", "sentences"):
        table[column] = table["method"].map(factuality[column].to_dict()).astype(float)
    adapters = table[table["method"].isin(list(separabilities))].dropna(subset=["ood_factuality"])
    rho = {
        column: float(adapters["mean"].corr(adapters[column], method="spearman"))
        if len(adapters) >= MIN_ADAPTERS_FOR_RHO
        else math.nan
        for column in ("ood_factuality", "id_factuality")
    }
    return table, rho
