"""The λ study: factuality and fluency against λ for every steering mode, and its curves with 95% intervals.

lambda_sweep(runs, lambdas, cfg, sets=("ID",), vectors=None, progress=None, use_cache=True, modes=("vector",),
             positions="all", grids=None, settings=None) -> DataFrame
    one row per (run, mode, λ, document) with the text, scores and fluency (each mode's neutral λ is the merged
    model); every (run, mode, λ) cached, so an interrupted sweep resumes
lambda_curve(df, protocol="sentence", by_set=False) -> DataFrame
    per (run, mode, λ): mean factuality with its 95% interval, the paired change to the neutral λ, fluency
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping, Sequence

from ...foundations.metrics import mean_ci
from ...runtime.modes import SteerConfig, lambda_grids
from ..cache import JSON, cached
from ..steering.fluency import Fluency, fluency, perplexities
from .config import EvalConfig, ProgressFn, Variant
from .documents import id_documents, ood_documents
from .evaluate import VariantModels, generate_for, scored_rows, steering_vectors_for
from .scorers import Scorer, make_scorer, score_summary
from .text import count_sentences


def lambda_sweep(
    runs,
    lambdas: Sequence[float],
    cfg: EvalConfig = EvalConfig(),
    sets: Sequence[str] = ("ID",),
    vectors=None,
    progress: ProgressFn | None = None,
    use_cache: bool = True,
    modes: Sequence[str] = ("vector",),
    positions: str = "all",
    grids: Mapping[str, Sequence[float]] | None = None,
    fluency_model: bool = True,
    settings: Mapping[str, float] | None = None,
):
    """Factuality and fluency against λ: one row per (run, mode, λ, document) with the text, both scores and the
    fluency measures (steering/fluency.py; perplexity under the run's base model unless fluency_model is False).
    `runs`: one adapter or a list; `modes`: names in the mode registry, each over `grids[mode]` when given, else
    `lambdas` (adding modes in normalised units). The neutral λ of a mode reuses the merged model's generations;
    every (run, mode, λ) is cached, so an interrupted sweep resumes where it stopped.
    `vectors`: SteeringVectors of a single run, or {run: SteeringVectors}. `settings`: the modes' own SteerConfig
    settings (a gated mode's tau and keep)."""
    import pandas as pd

    runs = [str(runs)] if isinstance(runs, (str, Path)) or hasattr(runs, "path") else [str(r) for r in runs]
    docs = (id_documents(cfg) if "ID" in sets else []) + (ood_documents(cfg) if "OOD" in sets else [])
    if not docs:
        raise ValueError(f"no documents for sets {tuple(sets)}: check cfg.n_id / cfg.n_ood and the data paths.")
    if vectors is not None and not isinstance(vectors, dict):
        vectors = {runs[0]: vectors}
    vectors = dict(vectors or {})
    scorer = make_scorer(cfg.scorer)
    models = VariantModels(cfg)
    rows, sites = [], {}
    for run in runs:
        vec = vectors.get(run) or steering_vectors_for(run, cfg, use_cache)
        sites[Path(run).name] = [s.key for s in vec.sites]
        texts_of_run: list[str] = []
        start = len(rows)
        for mode, grid in lambda_grids(modes, lambdas, grids).items():
            how = SteerConfig(mode, positions, **(settings or {}))
            for lam in grid:
                if progress:
                    progress(f"{Path(run).name} {mode} λ = {lam:g}: generating {len(docs)} summaries")
                v = Variant.steered(run, float(lam), how=how)
                texts = generate_for(v, docs, cfg, models, vec, use_cache)
                for row in scored_rows(v, docs, texts, scorer):
                    rows.append({**row, "mode": mode, "positions": positions})
                texts_of_run += texts
        base = models.base_of(run) if fluency_model else None
        for row, f in zip(rows[start:], fluency_of(texts_of_run, base, use_cache)):
            row.update(f.to_json())
    df = pd.DataFrame(rows)
    df.attrs["sites"] = sites
    return df


def fluency_of(texts: Sequence[str], lm=None, use_cache: bool = True) -> list[Fluency]:
    """topl_core.analysis.steering.fluency.fluency of each text, with perplexity under `lm` when given (the perplexities
    cached per (model, texts); the degenerate rule is applied afresh, so changed thresholds take effect)."""
    if lm is None:
        return fluency(texts)
    key = {"model": lm.fingerprint, "texts": hashlib.sha256("\x00".join(texts).encode()).hexdigest(), "n": len(texts)}
    ppl = cached("perplexity", key, lambda: perplexities(lm, texts), JSON, enabled=use_cache)
    return fluency(texts, lm, perplexity=ppl)


def document_curve(document: str, texts: Mapping[float, str], fluencies: Sequence[Mapping], scorer: Scorer):
    """One document's λ curve (the Steering page): per λ its text, factuality under `scorer` (sentence protocol;
    None for a degenerate text, which is damage rather than a less faithful summary), the text's fluency
    (`fluencies`: Fluency.to_json() of each text, in the order of `texts`), sentences and words."""
    import pandas as pd

    rows = []
    for (lam, text), f in zip(texts.items(), fluencies):
        rows.append(
            {
                "lambda": float(lam),
                "factuality": None if f["degenerate"] else score_summary(scorer, document, text).score,
                "degenerate": f["degenerate"],
                "reason": f["reason"],
                "perplexity": f["perplexity"],
                "distinct_2": f["distinct_2"],
                "sentences": count_sentences(text),
                "words": len(text.split()),
                "text": text,
            }
        )
    return pd.DataFrame(rows)


CURVE_KEYS = ("run", "mode", "lambda")


def lambda_curve(df, protocol: str = "sentence", by_set: bool = False):
    """Per (run, mode, λ[, set]): mean factuality with its standard error and 95% interval (normal approximation,
    mean ± 1.96·s.e. over documents), the same over the texts that are not degenerate, the share of degenerate
    texts, median perplexity, mean distinct-2 and repeated 3-grams, mean sentences and words, documents; and
    `change`: the paired difference to the mode's neutral λ (the merged model) over the
    same documents, with its 95% interval — much tighter than comparing two intervals, since documents differ more
    than λ values do (NaN when the neutral λ was not generated)."""
    col = f"score_{protocol}"
    keys = [k for k in CURVE_KEYS if k in df.columns] + (["set"] if by_set else [])
    out = []
    for key, part in df.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row.update(mean_ci(part[col], "factuality"))
        neutral = SteerConfig(row.get("mode", "vector")).neutral
        same = (df[[k for k in keys if k != "lambda"]] == part.iloc[0][[k for k in keys if k != "lambda"]]).all(1)
        ref = df[same & (df["lambda"] == neutral)].set_index(["set", "doc_id"])[col]
        paired = part.set_index(["set", "doc_id"])[col] - ref.reindex(part.set_index(["set", "doc_id"]).index)
        row.update(mean_ci(paired.dropna(), "change"))
        if "degenerate" in part:
            fluent = part[~part["degenerate"].astype(bool)]
            row.update(mean_ci(fluent[col], "factuality_fluent"))
            row["degenerate"] = float(part["degenerate"].astype(bool).mean())
            row["perplexity"] = float(part["perplexity"].median())
            row["distinct_2"] = float(part["distinct_2"].mean())
            row["repeated_3gram"] = float(part["repeated_3gram"].mean())
        row["sentences"] = float(part["n_sentences"].mean())
        row["words"] = float(part["n_words"].mean())
        row["empty"] = int((part["n_words"] == 0).sum())
        out.append(row)
    import pandas as pd

    return pd.DataFrame(out)
