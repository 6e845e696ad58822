"""Factuality evaluation (docs/design.md §2, "Evaluation"): generate a summary per document with base / merged / steered
models, score it against its document with a pluggable Scorer under both protocols, count sentences, and tabulate
like the paper (rows = model variant; columns ID, OOD, average, average sentence count). What is evaluated:
config.py (Variant, EvalConfig); on which documents: documents.py; the λ study: lambda_study.py.

    evaluate(variants, cfg, progress=None, use_cache=True, vectors=None, executor=ExecutorConfig()) -> EvalResult
        (each variant's generation a task: in this process or as Ray tasks, topl_core.foundations.executor)
    EvalResult.per_doc (DataFrame: variant, lambda, set, source, doc_id, text, score_sentence, score_full,
               n_sentences, n_words), .table(protocol="sentence", by_source=False), .quality (ScorerQuality or None)
    results_table(per_doc, protocol="sentence", by_source=False) -> DataFrame
    supported_sentences(per_doc) -> Series         each summary's sum of sentence scores (length-aware)
    protocol_agreement(per_doc) -> dict            Spearman ρ of sentence-level vs full-summary scores
    steering_vectors_for(run, cfg) -> SteeringVectors    from the run's validation split (cached projections)
    generate_for(variant, docs, cfg, models, vectors) -> list[str]   a variant's generations (cached)
    generations_for(...) -> list[SteeredText]      the same, with what a gate replaced

Generations are cached (topl_core.analysis.cache, kind "generations") keyed by the variant (adapter fingerprint,
λ, steering-vector fingerprint), the documents and the generation settings, so changing the scorer re-scores
without regenerating. Scores of the offline GroundingScorer come with its measured AUROC (EvalResult.quality).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from ...foundations.errors import RunError
from ...foundations.executor import ExecutorConfig, failure_report, run_tasks, worker_memo
from ...inference.generate import generate, load_merged
from ...models.loading import ModelSpec, load_model
from ...runtime.modes import SteerConfig
from ...runtime.session import SteeringSession
from ...runtime.steered_text import SteeredText
from ...training.adapters import open_adapter
from ..cache import JSON, cached
from ..lora_a.probe import ProbeSettings, labelled_split
from ..steering.extract import build_steering_vectors
from .config import OOD_MEAN, EvalConfig, ProgressFn, Variant
from .documents import EvalDoc, id_documents, ood_documents
from .quality import ScorerQuality, scorer_quality
from .scorers import PROTOCOLS, GroundingScorer, Scorer, make_scorer, score_summary


def _docs_fingerprint(docs: Sequence[EvalDoc]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.set}|{d.doc_id}|".encode() + d.document.encode())
    return h.hexdigest()[:16]


def vectors_fingerprint(vectors, how: SteerConfig = SteerConfig()) -> str:
    """What the mode applies at λ = 1, hashed (its action's fingerprint: a scaling mode's is its name, the adapter's
    fingerprint being already in the key)."""
    return how.spec.action.fingerprint(vectors, how.spec, how.units)


def steering_vectors_for(adapter, cfg: EvalConfig, use_cache: bool = True):
    """Steering vectors of an adapter from the labelled tokens of the validation split of its run's data (the
    default data set for an adapter from elsewhere), as `steer` does."""
    adapter = open_adapter(adapter)
    settings = ProbeSettings(random_control=False, precision=cfg.precision)
    return build_steering_vectors(adapter, labelled_split(adapter), settings, cfg.top_k, use_cache=use_cache)


def variant_model(v: Variant, default_model: str, device: str, precision: str):
    """The model a base or merged variant generates with, its weights for the compute `precision` (bf16 on a GPU
    that computes in bf16, else fp32: precision.weights_for): the base model (v.model, else default_model), or the
    variant's adapter merged into the base model it was trained on."""
    if v.run is None:
        return load_model(ModelSpec.computing(v.model or default_model, precision, device))
    adapter = open_adapter(v.run)
    return load_merged(ModelSpec.computing(adapter.base_model, precision, device), adapter)


class VariantModels:
    """Loads each base / merged model once per evaluation (steered variants share their run's merged model)."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self._cache: dict = {}

    def get(self, v: Variant):
        key = (v.run, v.model if v.run is None else None)
        if key not in self._cache:
            self._cache[key] = variant_model(v, self.cfg.model, self.cfg.device, self.cfg.generation.precision)
        return self._cache[key]

    def base_of(self, run):
        """The base model an adapter was trained on (for perplexity), loaded once."""
        return self.get(Variant.base(open_adapter(run).base_model))


def generate_for(
    v: Variant,
    docs: Sequence[EvalDoc],
    cfg: EvalConfig,
    models: VariantModels | None = None,
    vectors=None,
    use_cache: bool = True,
) -> list[str]:
    """The variant's generation for each document (cached): generations_for's texts."""
    return [g.text for g in generations_for(v, docs, cfg, models, vectors, use_cache)]


def generations_for(
    v: Variant,
    docs: Sequence[EvalDoc],
    cfg: EvalConfig,
    models: VariantModels | None = None,
    vectors=None,
    use_cache: bool = True,
) -> list[SteeredText]:
    """The variant's generation for each document (cached), as SteeredText: in a gated mode with what the head took
    back and the gate's counts (kept in the cache beside the text), else the text alone."""
    if not docs:
        return []
    models = models or VariantModels(cfg)
    adapter = open_adapter(v.run) if v.run else None
    steered = v.kind == "steered" and not v.generates_like_merged  # the neutral λ shares the merged model's entry
    if steered and vectors is None:
        vectors = steering_vectors_for(adapter, cfg)
    key = {
        "kind": "steered" if steered else "merged" if adapter else "base",
        "lam": v.lam if steered else None,
        "model": None if adapter else (v.model or cfg.model),
        "device": cfg.device,
        "docs": _docs_fingerprint(docs),
        "n": len(docs),
        "generation": asdict(cfg.generation),
        "vectors": vectors_fingerprint(vectors, v.how) if steered else None,
        **({"how": v.how.key()} if steered else {}),
    }

    def compute() -> list:  # a text, or a gated generation's whole record
        lm = models.get(v)
        documents = [d.document for d in docs]
        if steered:
            made = SteeringSession(lm, vectors).generations(documents, v.lam, cfg.generation, how=v.how)
            return [g.text if g.gate is None else g.to_json() for g in made]
        return generate(lm, documents, cfg.generation)

    stored = cached("generations", key, compute, JSON, adapter=adapter, enabled=use_cache)
    return [SteeredText(g) if isinstance(g, str) else SteeredText.from_json(g) for g in stored]


def scored_rows(v: Variant, docs: Sequence[EvalDoc], texts: Sequence[str], scorer: Scorer) -> list[dict]:
    rows = []
    for d, t in zip(docs, texts):
        sent = score_summary(scorer, d.document, t, "sentence")
        full = score_summary(scorer, d.document, t, "full")
        rows.append(
            {
                "variant": v.name,
                "kind": v.kind,
                "run": v.run,
                "lambda": v.lam,
                "set": d.set,
                "source": d.source,
                "doc_id": d.doc_id,
                "text": t,
                "score_sentence": sent.score,
                "score_full": full.score,
                "n_sentences": len(sent.claims),
                "n_words": len(t.split()),
                "scorer": scorer.name,
            }
        )
    return rows


@dataclass
class EvalResult:
    per_doc: "object"  # pandas DataFrame
    config: EvalConfig
    scorer: str
    quality: ScorerQuality | None = None
    extra: dict = field(default_factory=dict)

    def table(self, protocol: str = "sentence", by_source: bool = False):
        return results_table(self.per_doc, protocol, by_source)


def supported_sentences(per_doc):
    """Each summary's supported sentences: the sum of its sentences' scores (the sentence protocol's mean × its
    sentence count) — how much the summary says that its document supports. The mean per sentence rewards saying
    less (one safe sentence scores above three of which one is shaky); this count does not: read the two together."""
    return per_doc["score_sentence"] * per_doc["n_sentences"]


def results_table(per_doc, protocol: str = "sentence", by_source: bool = False):
    """Rows = variant (in first-seen order); columns ID, OOD (means over documents of the protocol's score),
    average (mean of the ID and OOD means, as in the paper), sentences (mean sentence count over all documents),
    words, supported (mean supported sentences per summary, a length-aware measure: supported_sentences), n_ID,
    n_OOD; with by_source, one extra column per OOD source and, with several sources, their unweighted mean
    (OOD_MEAN)."""
    import pandas as pd

    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}: choose one of {PROTOCOLS}.")
    col = f"score_{protocol}"
    out = []
    for name in dict.fromkeys(per_doc["variant"]):
        sub = per_doc[per_doc["variant"] == name]
        row = {"variant": name}
        means = []
        for s in ("ID", "OOD"):
            part = sub[sub["set"] == s]
            row[s] = float(part[col].mean()) if len(part) else float("nan")
            row[f"n_{s}"] = int(len(part))
            if len(part):
                means.append(row[s])
        row["average"] = float(np.mean(means)) if means else float("nan")
        row["sentences"] = float(sub["n_sentences"].mean())
        row["words"] = float(sub["n_words"].mean())
        row["supported"] = float(supported_sentences(sub).mean())
        if by_source:
            by = {src: float(part[col].mean()) for src, part in sub[sub["set"] == "OOD"].groupby("source")}
            if len(by) > 1:  # the paper's average over datasets: each dataset weighs the same, whatever its size
                row[OOD_MEAN] = float(np.mean(list(by.values())))
            row.update(by)
        out.append(row)
    cols = ["variant", "ID", "OOD", "average", "sentences", "words", "supported", "n_ID", "n_OOD"]
    df = pd.DataFrame(out)
    return df[cols + [c for c in df.columns if c not in cols]].set_index("variant")


def protocol_agreement(per_doc) -> dict[str, float]:
    """How far the two protocols agree (the paper's appendix): Spearman ρ between the sentence-level and the
    full-summary score over every generated summary ("summaries"), and between the variants' mean scores over all
    documents ("variants"; NaN below three variants, where a rank correlation says nothing)."""
    means = per_doc.groupby("variant", sort=False)[["score_sentence", "score_full"]].mean()
    summaries = per_doc[["score_sentence", "score_full"]].dropna()
    return {
        "summaries": float(summaries["score_sentence"].corr(summaries["score_full"], method="spearman")),
        "variants": float(means["score_sentence"].corr(means["score_full"], method="spearman"))
        if len(means) >= 3
        else float("nan"),
        "n_summaries": int(len(summaries)),
        "n_variants": int(len(means)),
    }


@dataclass(frozen=True)
class _Shard:
    """What every variant's task of one evaluation needs (sent to Ray's object store once)."""

    cfg: EvalConfig
    docs: tuple[EvalDoc, ...]
    vectors: dict
    use_cache: bool
    progress: ProgressFn | None  # only when the variants run in this process


def generate_variant(shard: _Shard, v: Variant) -> dict:
    """One variant of an evaluation as a task (foundations/executor.py): its generations for every document (from the
    cache when there; written to it otherwise). The worker keeps the models it loaded for the evaluation."""
    if shard.progress:
        shard.progress(f"{v.name}: generating {len(shard.docs)} summaries")
    models = worker_memo("eval-models", shard.cfg, lambda: VariantModels(shard.cfg))
    vec = None
    if v.kind == "steered":
        vec = shard.vectors.get(v.run) or steering_vectors_for(v.run, shard.cfg, shard.use_cache)
    return {"texts": generate_for(v, shard.docs, shard.cfg, models, vec, shard.use_cache)}


def evaluate(
    variants: Sequence[Variant],
    cfg: EvalConfig = EvalConfig(),
    progress: ProgressFn | None = None,
    use_cache: bool = True,
    vectors: dict | None = None,
    measure_quality: bool | None = None,
    executor: ExecutorConfig = ExecutorConfig(),
) -> EvalResult:
    """Generate with every variant on the ID and OOD documents, score both protocols, and collect per-document rows.
    `vectors` maps a run path to its SteeringVectors (computed from the run's val split when missing).
    measure_quality (default: only for the offline grounding scorer) attaches the scorer's cached AUROC report.
    Each variant's generation is a task run by `executor` (local: one after another here; ray: as Ray tasks, each
    worker writing the shared cache); scoring happens here as the tasks end.

    Example: ``evaluate([Variant.base(), Variant.merged(path), Variant.steered(path, 2.0)], EvalConfig()).table()``"""
    import pandas as pd

    docs = id_documents(cfg) + ood_documents(cfg)
    if not docs:
        raise ValueError(f"no documents to evaluate: {cfg.data} has no test split documents and CLIFF is absent.")
    scorer = make_scorer(cfg.scorer)
    texts: dict[str, list[str]] = {}

    local = executor.kind == "local"

    def on_done(v: Variant, result: dict) -> None:
        texts[v.name] = result["texts"]
        if progress and not local:
            progress(f"{v.name}: {len(result['texts'])} summaries generated")

    shard = _Shard(cfg, tuple(docs), dict(vectors or {}), use_cache, progress if local else None)
    failures = run_tasks(generate_variant, shard, variants, executor, on_done)
    if failures:
        raise RunError(failure_report(None, {f.item.name: f for f in failures}))
    rows = [row for v in variants for row in scored_rows(v, docs, texts[v.name], scorer)]
    quality = None
    if measure_quality or (measure_quality is None and isinstance(scorer, GroundingScorer)):
        quality = scorer_quality(scorer, cfg.cliff_csv)
    return EvalResult(pd.DataFrame(rows), cfg, scorer.name, quality)
