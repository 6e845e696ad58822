"""Gated steering against always-on steering and the merged model: τ, λ and k chosen on dev documents only, then one
table on held-out documents with paired 95% intervals.

Documents: the adapter's own data split by document as it was trained (its val split for dev, its test split held
out) and CLIFF's own cut column (val / test), n_split and n_cliff of each. Every generation goes through the
evaluation's cache (evaluate.generate_for), so a run that stops resumes; the texts are scored as the evaluation scores
them (sentence protocol), for fluency (perplexity under the base model, the degenerate rule) and by the adapter's own
head (the share of a text's tokens with p(good) < FLAG_THRESHOLD). A study without τ values (an adapter without a head,
which has no gate) compares always-on steering with the merged model alone.

    GatedStudy(run, lambdas, taus, keeps, n_split, n_cliff, positions)
    Scoring(study, cfg)                   the models both steps share (pass it to both: loaded once)
    choose(study, cfg) -> Choice          on dev documents: the always-on λ and the gated (λ, τ, k) with the highest
                                          mean factuality, a degenerate text scoring 0 (damage is not a summary)
    compare(study, cfg, choice) -> DataFrame      held-out rows: variant, set, doc_id, factuality, supported,
                                                  degenerate, log_perplexity, flagged_share, replaced, tokens,
                                                  words (and the text)
    paired_table(rows, by_set=False) -> DataFrame  per metric: each variant's mean with its 95% interval, and the paired
                                                  differences gated − always-on, gated − merged, always-on − merged
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ...data.records import Record, read_jsonl
from ...data.split import first_documents, split_records
from ...foundations.metrics import mean_ci
from ...foundations.paths import project_path
from ...foundations.presets import FLAG_THRESHOLD
from ...inference.token_scores import TokenScorer
from ...models.loading import ModelSpec, load_model
from ...runtime.modes import SteerConfig
from ...training.adapters import open_adapter
from .config import EvalConfig, ProgressFn, Variant
from .documents import EvalDoc, ood_documents
from .evaluate import VariantModels, generations_for, scored_rows, steering_vectors_for, supported_sentences
from .lambda_study import fluency_of
from .scorers import make_scorer

METRICS = ("factuality", "degenerate", "log_perplexity", "flagged_share")
PAIRS = (("gated", "always-on"), ("gated", "merged"), ("always-on", "merged"))


@dataclass(frozen=True)
class GatedStudy:
    """What is compared: the adapter `run`, the grid searched on dev documents (λ in normalised units for both
    steered variants; τ and k for the gated one), the documents per source and the always-on variant's positions."""

    run: str
    lambdas: tuple[float, ...] = (1.0, 2.0)
    taus: tuple[float, ...] = (0.5, 0.7, 0.9)  # the demo head flags few of the model's own tokens at 0.5
    keeps: tuple[int, ...] = (0, 4)
    n_split: int = 8
    n_cliff: int = 8
    positions: str = "all"

    def __post_init__(self) -> None:
        if not self.lambdas or (self.taus and not self.keeps) or self.n_split + self.n_cliff < 1:
            raise ValueError("GatedStudy: give λ values (τ and k values for a gate) and at least one document.")
        for tau, keep in itertools.product(self.taus, self.keeps):
            SteerConfig("gated", tau=tau, keep=keep)  # names a τ or k out of range
        SteerConfig("vector", self.positions)

    @property
    def gates(self) -> bool:
        """Whether the gated variant is compared (τ values given)."""
        return bool(self.taus)

    def always_on(self, lam: float) -> Variant:
        return Variant.steered(self.run, lam, name=f"always-on λ={lam:g}", how=SteerConfig("vector", self.positions))

    def gated(self, lam: float, tau: float, keep: int) -> Variant:
        how = SteerConfig("gated", tau=tau, keep=keep)
        return Variant.steered(self.run, lam, name=f"gated λ={lam:g} τ={tau:g} k={keep}", how=how)

    def documents(self, cfg: EvalConfig, split: str) -> list[EvalDoc]:
        """The dev ("val") or held-out ("test") documents: the adapter's data split, then CLIFF's cut."""
        settings = open_adapter(self.run).settings
        records = split_records(read_jsonl(project_path(settings.data)), seed=settings.split_seed)[split]
        ids = [EvalDoc("ID", r.source, r.doc_id, r.document) for r in first_documents(records, self.n_split)]
        return ids + ood_documents(replace(cfg, n_ood=self.n_cliff), cut=split)


@dataclass(frozen=True)
class Choice:
    """The settings chosen on dev documents, and every candidate's dev score (the table they were chosen from); the
    gate's are None where the study has none."""

    always_on_lambda: float
    gated_lambda: float | None
    tau: float | None
    keep: int | None
    dev: object  # DataFrame: variant, lambda, tau, keep, score, factuality, degenerate, n


class Scoring:
    """The models and scorers one study shares: generation, factuality, fluency and the adapter's head."""

    def __init__(self, study: GatedStudy, cfg: EvalConfig, use_cache: bool = True):
        adapter = open_adapter(study.run)
        self.study, self.cfg, self.use_cache = study, cfg, use_cache
        self.models, self.scorer = VariantModels(cfg), make_scorer(cfg.scorer)
        self.vectors = steering_vectors_for(adapter, cfg, use_cache)
        spec = ModelSpec.computing(adapter.base_model, cfg.precision, cfg.device)
        self.head = (
            TokenScorer(load_model(spec), adapter, cfg.precision, max_doc_tokens=cfg.max_doc_tokens)
            if adapter.has_head
            else None
        )

    def rows(self, v: Variant, docs: Sequence[EvalDoc], label: str, tau: float | None = None) -> list[dict]:
        """One row per document (module docstring); with `tau`, also the share of the text's tokens the gate at τ
        would flag (flagged_at_tau)."""
        made = generations_for(v, docs, self.cfg, self.models, self.vectors, self.use_cache)
        texts = [g.text for g in made]
        fluent = fluency_of(texts, self.models.base_of(self.study.run), self.use_cache)
        # the head's verdict on every text that has tokens (an empty text has no share of flagged tokens; without a
        # head, no text has one)
        said = [(d, t) for d, t in zip(docs, texts) if t.strip()] if self.head is not None else []
        scores = (
            self.head.score([Record(d.doc_id, d.document, t, token_labels_known=False) for d, t in said])
            if said
            else []
        )
        p_good = {d.doc_id: s.p_good for (d, _), s in zip(said, scores)}
        out = []
        for row, f, g in zip(scored_rows(v, docs, texts, self.scorer), fluent, made):
            ppl, p = f.perplexity, p_good.get(row["doc_id"])
            out.append(
                {
                    "variant": label,
                    "name": v.name,
                    "set": row["set"],
                    "source": row["source"],
                    "doc_id": row["doc_id"],
                    "factuality": row["score_sentence"],
                    "supported": supported_sentences(row),
                    "degenerate": float(f.degenerate),
                    "log_perplexity": float(np.log(ppl)) if ppl else float("nan"),
                    "flagged_share": float((p < FLAG_THRESHOLD).mean()) if p is not None else float("nan"),
                    **({"flagged_at_tau": float((p < tau).mean()) if p is not None else float("nan")} if tau else {}),
                    # what a gate did: the tokens it replaced, of those generated (NaN where no gate ran)
                    "replaced": float(len(g.replacements)) if g.gate else float("nan"),
                    "tokens": float(g.gate.tokens) if g.gate else float("nan"),
                    "words": row["n_words"],
                    "text": row["text"],
                }
            )
        return out


def _dev_score(rows: list[dict]) -> dict:
    """Mean factuality with a degenerate text scored 0, the plain mean and the degenerate share."""
    fact = np.array([r["factuality"] for r in rows], dtype=float)
    degenerate = np.array([r["degenerate"] for r in rows], dtype=float)
    return {
        "score": float(np.where(degenerate > 0, 0.0, fact).mean()),
        "factuality": float(fact.mean()),
        "degenerate": float(degenerate.mean()),
        "n": len(rows),
    }


def choose(
    study: GatedStudy, cfg: EvalConfig, progress: ProgressFn | None = None, scoring: Scoring | None = None
) -> Choice:
    """The always-on λ and the gated (λ, τ, k) with the best dev score (module docstring); ties go to the first
    listed (λ, then τ, then k, as given)."""
    import pandas as pd

    docs, scoring = study.documents(cfg, "val"), scoring or Scoring(study, cfg)
    table = []
    for lam in study.lambdas:
        if progress:
            progress(f"dev: always-on λ = {lam:g} on {len(docs)} documents")
        rows = scoring.rows(study.always_on(lam), docs, "")
        table.append({"variant": "always-on", "lambda": lam, **_dev_score(rows)})
    for lam, tau, keep in itertools.product(study.lambdas, study.taus, study.keeps):
        if progress:
            progress(f"dev: gated λ = {lam:g}, τ = {tau:g}, k = {keep} on {len(docs)} documents")
        rows = scoring.rows(study.gated(lam, tau, keep), docs, "")
        table.append({"variant": "gated", "lambda": lam, "tau": tau, "keep": keep, **_dev_score(rows)})
    dev = pd.DataFrame(table)
    variants = ("always-on", "gated") if study.gates else ("always-on",)
    best = {v: dev.loc[dev[dev["variant"] == v]["score"].idxmax()] for v in variants}
    on = float(best["always-on"]["lambda"])
    if not study.gates:
        return Choice(on, None, None, None, dev)
    g = best["gated"]
    return Choice(on, float(g["lambda"]), float(g["tau"]), int(g["keep"]), dev)


def compare(
    study: GatedStudy,
    cfg: EvalConfig,
    choice: Choice,
    progress: ProgressFn | None = None,
    scoring: Scoring | None = None,
):
    """The held-out rows of the merged model, always-on steering at the chosen λ and gated steering at the chosen
    (λ, τ, k), one per document and variant (module docstring)."""
    import pandas as pd

    docs, scoring = study.documents(cfg, "test"), scoring or Scoring(study, cfg)
    variants = {
        "merged": Variant.merged(study.run),
        "always-on": study.always_on(choice.always_on_lambda),
    }
    if study.gates:
        variants["gated"] = study.gated(choice.gated_lambda, choice.tau, choice.keep)
    rows = []
    for label, v in variants.items():
        if progress:
            progress(f"held out: {v.name} on {len(docs)} documents")
        rows += scoring.rows(v, docs, label)
    return pd.DataFrame(rows)


def paired_table(rows, by_set: bool = False):
    """Per metric (and set): each variant's mean with its 95% interval, then each pair's paired difference over the
    same documents with its interval (documents differ more than variants do, so a paired interval is much tighter
    than two intervals compared). A metric that is NaN for a document (an empty text's perplexity) drops that pair."""
    import pandas as pd

    out = []
    variants = [v for v in ("merged", "always-on", "gated") if v in set(rows["variant"])]
    groups = rows.groupby("set", sort=True) if by_set else [("all", rows)]
    for set_name, part in groups:
        by_doc = part.set_index(["set", "doc_id", "variant"])
        for metric in METRICS:
            table = by_doc[metric].unstack("variant").reindex(columns=variants)
            for variant in variants:
                out.append({"set": set_name, "metric": metric, "comparison": variant, **_ci(table[variant])})
            for a, b in [(a, b) for a, b in PAIRS if a in variants and b in variants]:
                out.append({"set": set_name, "metric": metric, "comparison": f"{a} − {b}", **_ci(table[a] - table[b])})
    return pd.DataFrame(out)


def _ci(x) -> dict:
    c = mean_ci(x.dropna(), "v")
    return {"mean": c["v"], "lo": c["v_lo"], "hi": c["v_hi"], "n": c["v_n"]}
