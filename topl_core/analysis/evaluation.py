"""Factuality evaluation (docs/design.md §2, "Evaluation"): generate a summary per document with base / merged / steered
models, score it against its document with a pluggable Scorer under both protocols, count sentences, and tabulate
like the paper (rows = model variant; columns ID, OOD, average, average sentence count). Also the λ sweep:
factuality and length against λ for one adapter's steering vectors, with the generated texts.

Public API
    Variant(name, run=None, lam=None)              base (run None), merged (run, lam None), steered (run, lam)
    Variant.base(model) / Variant.merged(run) / Variant.steered(run, lam)
    EvalConfig(data, split_seed, n_id, n_ood, cliff_csv, max_new_tokens, max_doc_tokens, batch_size, scorer, top_k)
    id_documents(cfg) -> list[EvalDoc]             first n_id documents of the held-out *test* split of `data`
    ood_documents(cfg) -> list[EvalDoc]            n_ood CLIFF documents, alternating cliff-xsum / cliff-cnndm; or,
                                                   with cfg.ood_data (AggreFact, LLM-AggreFact), n_ood per dataset
    protocol_agreement(per_doc) -> dict            Spearman ρ of sentence-level vs full-summary scores
    evaluate(variants, cfg, progress=None, use_cache=True, vectors=None, executor=ExecutorConfig()) -> EvalResult
        (each variant's generation a task: in this process or as Ray tasks, topl_core.executor)
    EvalResult.per_doc (DataFrame: variant, lambda, set, source, doc_id, text, score_sentence, score_full,
               n_sentences, n_words), .table(protocol="sentence", by_source=False), .quality (ScorerQuality or None)
    results_table(per_doc, protocol="sentence", by_source=False) -> DataFrame
    lambda_sweep(run, lambdas, cfg, sets=("ID",), vectors=None, progress=None, use_cache=True) -> DataFrame
        one row per (λ, document) with the text and scores (λ = 0 is the merged model)
    lambda_curve(df, protocol="sentence") -> DataFrame   per λ: mean, sem, mean sentences, mean words, n
    steering_vectors_for(run, cfg) -> SteeringVectors    from the run's validation split (cached projections)

Generations are cached (topl_core.analysis.cache, kind "generations") keyed by the variant (adapter fingerprint,
λ, steering-vector fingerprint), the documents and the generation settings, so changing the scorer re-scores
without regenerating. Scores of the offline GroundingScorer come with its measured AUROC (EvalResult.quality).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..adapters import open_adapter
from ..data.cliff import csv_rows
from ..data.records import read_jsonl
from ..data.split import first_documents, split_records
from ..errors import DataError, RunError
from ..executor import ExecutorConfig, failure_report, run_tasks, worker_memo
from ..generate import GenerationConfig, generate, load_merged
from ..models import ModelSpec, load_model
from ..paths import DEFAULT_DATA, cliff_csv, project_path
from ..precision import Precision, resolve_precision
from ..presets import DEFAULT_MODEL
from .cache import JSON, cached
from .fluency import Fluency, fluency, perplexities
from .probe import ProbeSettings, labelled_records
from .scorers import PROTOCOLS, GroundingScorer, Scorer, ScorerQuality, make_scorer, score_summary, scorer_quality
from .steering import SteerConfig, SteeringSession, build_steering_vectors

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """A model to evaluate: the base model (`run` None; `model` names it), a run's merged adapter (`lam` None), or
    the merged adapter steered with λ in mode `how` (topl_core.analysis.steering.SteerConfig)."""

    name: str
    run: str | None = None
    lam: float | None = None
    model: str | None = None  # base model spec for run=None (default: the config's / first run's base)
    how: SteerConfig = SteerConfig()

    @classmethod
    def base(cls, model: str | None = None, name: str = "base") -> "Variant":
        return cls(name, None, None, model)

    @classmethod
    def merged(cls, run, name: str | None = None) -> "Variant":
        return cls(name or f"merged ({Path(run).name})", str(run))

    @classmethod
    def steered(cls, run, lam: float, name: str | None = None, how: SteerConfig = SteerConfig()) -> "Variant":
        mode = "" if how == SteerConfig() else f" {how.mode}" + (" gen-only" if how.positions == "generated" else "")
        return cls(name or f"steered{mode} λ={lam:g} ({Path(run).name})", str(run), float(lam), how=how)

    @property
    def kind(self) -> str:
        return "base" if self.run is None else "merged" if self.lam is None else "steered"

    @property
    def generates_like_merged(self) -> bool:
        """Steered at the λ that changes nothing (0, or 1 in the conditional mode): the merged model's texts."""
        return self.kind == "merged" or (self.kind == "steered" and self.lam == self.how.neutral)


OOD_MEAN = "OOD mean of datasets"  # the column of the paper's OOD figure: each dataset weighs the same


@dataclass(frozen=True)
class EvalConfig:
    data: str = DEFAULT_DATA  # ID: the held-out test split of this training data
    split_seed: int = 0
    n_id: int = 16
    n_ood: int = 16  # CLIFF: documents in all, alternating its sources; with ood_data: documents per dataset
    cliff_csv: str | None = None  # OOD documents; default shared/data/CLIFF_error_types.csv
    # OOD over a benchmark of several datasets instead (the paper: LLM-AggreFact's 11, up to 300 documents each): a
    # CSV or parquet with doc and dataset columns (AggreFact, LLM-AggreFact) by path, or a hub dataset id
    ood_data: str | None = None
    max_new_tokens: int = 96
    max_doc_tokens: int = 512
    batch_size: int = 4
    scorer: str = "grounding"
    top_k: int = 4  # steered sites
    model: str = DEFAULT_MODEL  # base model when no run names one
    device: str = "cpu"
    precision: Precision = "auto"  # of the generations; resolved for `device` when built (topl_core.precision)

    def __post_init__(self) -> None:
        if self.n_id < 0 or self.n_ood < 0 or self.n_id + self.n_ood == 0:
            raise ValueError(f"n_id={self.n_id}, n_ood={self.n_ood}: evaluate at least one document (both >= 0).")
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))

    @property
    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            max_doc_tokens=self.max_doc_tokens,
            batch_size=self.batch_size,
            precision=self.precision,
        )


@dataclass(frozen=True)
class EvalDoc:
    set: str  # "ID" or "OOD"
    source: str
    doc_id: str
    document: str


def id_documents(cfg: EvalConfig) -> list[EvalDoc]:
    """The first n_id distinct documents of the test split (document-level split, as in training)."""
    if cfg.n_id == 0:
        return []
    test = split_records(read_jsonl(project_path(cfg.data)), seed=cfg.split_seed)["test"]
    return [
        EvalDoc("ID", r.source.replace("-perturbed", ""), r.doc_id, r.document) for r in first_documents(test, cfg.n_id)
    ]


def ood_documents(cfg: EvalConfig) -> list[EvalDoc]:
    """OOD documents. Default: n_ood distinct CLIFF documents, taken alternately from each source (cliff-xsum,
    cliff-cnndm), in file order; empty when the CSV is absent. With cfg.ood_data: up to n_ood distinct documents of
    every dataset in that benchmark (source = its dataset, and origin when the file has one), in file order."""
    if cfg.n_ood == 0:
        return []
    if cfg.ood_data:
        return _benchmark_documents(cfg.ood_data, cfg.n_ood)
    path = Path(cfg.cliff_csv) if cfg.cliff_csv else cliff_csv()
    if not path.is_file():
        return []
    by_source: dict[str, list[EvalDoc]] = {}
    seen = set()
    for row in csv_rows(path, required=("doc",)):
        doc_id = f"{row.get('origin', 'cliff')}-{row.get('id', '')}"
        if doc_id in seen:
            continue
        seen.add(doc_id)
        source = f"cliff-{row['origin']}" if row.get("origin") else "cliff"
        by_source.setdefault(source, []).append(EvalDoc("OOD", source, doc_id, row["doc"]))
    out, queues = [], [list(v) for _, v in sorted(by_source.items())]
    while len(out) < cfg.n_ood and any(queues):
        for q in queues:
            if q and len(out) < cfg.n_ood:
                out.append(q.pop(0))
    return out


def _benchmark_documents(spec: str, per_dataset: int) -> list[EvalDoc]:
    out, seen, count = [], set(), Counter()
    for row in benchmark_rows(spec):
        source = "-".join(str(row[c]) for c in ("dataset", "origin") if row.get(c)) or "ood"
        doc = str(row["doc"])
        doc_id = f"{source}-{row.get('id') or hashlib.sha256(doc.encode()).hexdigest()[:12]}"
        if doc_id in seen or count[source] >= per_dataset:
            continue
        seen.add(doc_id)
        count[source] += 1
        out.append(EvalDoc("OOD", source, doc_id, doc))
    return out


def benchmark_rows(spec: str) -> list[dict]:
    """The rows of a factuality benchmark (AggreFact, LLM-AggreFact): a CSV or parquet file with at least doc and
    dataset columns, or a hub dataset id (needs a hub; its "test" split, else its first)."""
    path = Path(spec)
    if path.is_file():
        if path.suffix == ".parquet":
            import pandas as pd

            try:
                table = pd.read_parquet(path)
            except Exception as e:  # pyarrow's own error types for a file that is not parquet
                raise DataError(f"{path}: not a readable parquet file ({e}).") from e
            rows = table.astype(str).to_dict("records")
        else:
            rows = csv_rows(path, required=())  # the columns are checked below, for every kind of input
    elif path.suffix in (".csv", ".parquet") or not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise DataError(f"{spec}: no such file. Give the path of an AggreFact / LLM-AggreFact CSV or parquet file.")
    else:
        rows = hub_rows(spec, "Give the path of a CSV or parquet copy.")
    absent = [c for c in ("doc", "dataset") if rows and c not in rows[0]]
    if absent or not rows:
        raise DataError(
            f"{spec}: {'no rows' if not rows else f'missing column(s) {absent}'}; a benchmark needs "
            "doc and dataset columns (one row per summary or claim)."
        )
    return rows


def hub_rows(dataset_id: str, fix: str, config: str | None = None, split: str | None = None) -> list[dict]:
    """The rows of a hub dataset (needs a hub): `split`, else its "test" split, else its first. Any failure (no hub
    here, an unknown or gated id) is a DataError ending with `fix` (what to give instead)."""
    try:
        import datasets

        if split is None:
            loaded = datasets.load_dataset(dataset_id, config)
            table = loaded["test" if "test" in loaded else next(iter(loaded))]
        else:
            table = datasets.load_dataset(dataset_id, config, split=split)
        return [dict(r) for r in table]
    except Exception as e:
        raise DataError(
            f"{dataset_id}: not a file here, and loading it as a hub dataset failed ({type(e).__name__}: {e}). {fix}"
        ) from e


def _docs_fingerprint(docs: Sequence[EvalDoc]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.set}|{d.doc_id}|".encode() + d.document.encode())
    return h.hexdigest()[:16]


def vectors_fingerprint(vectors, how: SteerConfig = SteerConfig()) -> str:
    """What a constant mode adds at λ = 1, hashed (the conditional mode adds the adapter's own update: its
    fingerprint is the adapter's)."""
    if how.mode == "conditional":
        return "conditional"
    h = hashlib.sha256()
    deltas = vectors.deltas(how.mode, how.units)
    for k in sorted(deltas):
        h.update(k.encode() + np.asarray(deltas[k], np.float32).tobytes())
    return h.hexdigest()[:16]


def steering_vectors_for(adapter, cfg: EvalConfig, use_cache: bool = True):
    """Steering vectors of an adapter from the labelled tokens of the validation split of its run's data (the
    default data set for an adapter from elsewhere), as `steer` does."""
    adapter = open_adapter(adapter)
    tcfg = adapter.settings
    records = labelled_records(split_records(read_jsonl(project_path(tcfg.data)), seed=tcfg.split_seed)["val"])
    settings = ProbeSettings(random_control=False, precision=cfg.precision)
    return build_steering_vectors(adapter, records, settings, cfg.top_k, use_cache=use_cache)


def variant_model(v: Variant, default_model: str, device: str):
    """The model a base or merged variant generates with (fp32): the base model (v.model, else default_model), or
    the variant's adapter merged into the base model it was trained on."""
    if v.run is None:
        return load_model(ModelSpec(v.model or default_model, "float32", device))
    adapter = open_adapter(v.run)
    return load_merged(ModelSpec(adapter.base_model, "float32", device), adapter)


class VariantModels:
    """Loads each base / merged model once per evaluation (steered variants share their run's merged model)."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self._cache: dict = {}

    def get(self, v: Variant):
        key = (v.run, v.model if v.run is None else None)
        if key not in self._cache:
            self._cache[key] = variant_model(v, self.cfg.model, self.cfg.device)
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
    """The variant's generation for each document (cached)."""
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
        **({"how": asdict(v.how)} if steered else {}),
    }

    def compute() -> list[str]:
        lm = models.get(v)
        documents = [d.document for d in docs]
        if steered:
            return SteeringSession(lm, vectors).generate_many(documents, v.lam, cfg.generation, how=v.how)
        return generate(lm, documents, cfg.generation)

    return cached("generations", key, compute, JSON, adapter=adapter, enabled=use_cache)


def _rows(v: Variant, docs: Sequence[EvalDoc], texts: Sequence[str], scorer: Scorer) -> list[dict]:
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


def results_table(per_doc, protocol: str = "sentence", by_source: bool = False):
    """Rows = variant (in first-seen order); columns ID, OOD (means over documents of the protocol's score),
    average (mean of the ID and OOD means, as in the paper), sentences (mean sentence count over all documents),
    words, n_ID, n_OOD; with by_source, one extra column per OOD source and, with several sources, their unweighted
    mean (OOD_MEAN)."""
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
        if by_source:
            by = {src: float(part[col].mean()) for src, part in sub[sub["set"] == "OOD"].groupby("source")}
            if len(by) > 1:  # the paper's average over datasets: each dataset weighs the same, whatever its size
                row[OOD_MEAN] = float(np.mean(list(by.values())))
            row.update(by)
        out.append(row)
    cols = ["variant", "ID", "OOD", "average", "sentences", "words", "n_ID", "n_OOD"]
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
    """One variant of an evaluation as a task (topl_core.executor): its generations for every document (from the
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
    worker writing the shared cache); scoring happens here as the tasks end."""
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
    rows = [row for v in variants for row in _rows(v, docs, texts[v.name], scorer)]
    quality = None
    if measure_quality or (measure_quality is None and isinstance(scorer, GroundingScorer)):
        quality = scorer_quality(scorer, cfg.cliff_csv)
    return EvalResult(pd.DataFrame(rows), cfg, scorer.name, quality)


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
    conditional_lambdas: Sequence[float] | None = None,
    fluency_model: bool = True,
):
    """Factuality and fluency against λ: one row per (run, mode, λ, document) with the text, both scores and the
    fluency measures (topl_core.analysis.fluency; perplexity under the run's base model unless fluency_model is
    False). `runs`: one adapter or a list; `modes`: SteerConfig modes, constant ones over `lambdas` (normalised
    units), "conditional" over `conditional_lambdas` (default `lambdas`). The neutral λ of a mode reuses the merged
    model's generations; every (run, mode, λ) is cached, so an interrupted sweep resumes where it stopped.
    `vectors`: SteeringVectors of a single run, or {run: SteeringVectors}."""
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
        for mode in modes:
            how = SteerConfig(mode, positions)
            grid = conditional_lambdas if mode == "conditional" and conditional_lambdas is not None else lambdas
            for lam in grid:
                if progress:
                    progress(f"{Path(run).name} {mode} λ = {lam:g}: generating {len(docs)} summaries")
                v = Variant.steered(run, float(lam), how=how)
                texts = generate_for(v, docs, cfg, models, vec, use_cache)
                for row in _rows(v, docs, texts, scorer):
                    rows.append({**row, "mode": mode, "positions": positions})
                texts_of_run += texts
        base = models.base_of(run) if fluency_model else None
        for row, f in zip(rows[start:], fluency_of(texts_of_run, base, use_cache)):
            row.update(f.to_json())
    df = pd.DataFrame(rows)
    df.attrs["sites"] = sites
    return df


def fluency_of(texts: Sequence[str], lm=None, use_cache: bool = True) -> list[Fluency]:
    """topl_core.analysis.fluency.fluency of each text, with perplexity under `lm` when given (the perplexities
    cached per (model, texts); the degenerate rule is applied afresh, so changed thresholds take effect)."""
    if lm is None:
        return fluency(texts)
    key = {"model": lm.fingerprint, "texts": hashlib.sha256("\x00".join(texts).encode()).hexdigest(), "n": len(texts)}
    ppl = cached("perplexity", key, lambda: perplexities(lm, texts), JSON, enabled=use_cache)
    return fluency(texts, lm, perplexity=ppl)


CURVE_KEYS = ("run", "mode", "lambda")


def lambda_curve(df, protocol: str = "sentence", by_set: bool = False):
    """Per (run, mode, λ[, set]): mean factuality with its standard error and 95% interval (normal approximation,
    mean ± 1.96·s.e. over documents), the same over the texts that are not degenerate, the share of degenerate
    texts, median perplexity, mean distinct-2 and repeated 3-grams, mean sentences and words, documents; and
    `change`: the paired difference to the mode's neutral λ (0, or 1 when conditional; the merged model) over the
    same documents, with its 95% interval — much tighter than comparing two intervals, since documents differ more
    than λ values do (NaN when the neutral λ was not generated)."""
    col = f"score_{protocol}"
    keys = [k for k in CURVE_KEYS if k in df.columns] + (["set"] if by_set else [])
    out = []
    for key, part in df.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row.update(_mean_ci(part[col], "factuality"))
        neutral = SteerConfig(row.get("mode", "vector")).neutral
        same = (df[[k for k in keys if k != "lambda"]] == part.iloc[0][[k for k in keys if k != "lambda"]]).all(1)
        ref = df[same & (df["lambda"] == neutral)].set_index(["set", "doc_id"])[col]
        paired = part.set_index(["set", "doc_id"])[col] - ref.reindex(part.set_index(["set", "doc_id"]).index)
        row.update(_mean_ci(paired.dropna(), "change"))
        if "degenerate" in part:
            fluent = part[~part["degenerate"].astype(bool)]
            row.update(_mean_ci(fluent[col], "factuality_fluent"))
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


def _mean_ci(x, name: str) -> dict:
    n = int(len(x))
    mean = float(x.mean()) if n else float("nan")
    sem = float(x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return {
        name: mean,
        f"{name}_sem": sem,
        f"{name}_lo": mean - 1.96 * sem,
        f"{name}_hi": mean + 1.96 * sem,
        f"{name}_n": n,
    }
