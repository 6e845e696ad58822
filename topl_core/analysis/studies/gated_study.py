"""Detect-then-steer held out, in the adapter's domain and outside it (`python -m topl_core gated-study`): the merged
model, always-on steering and gated steering at the adapter's recommended settings (recommend.py: τ, λ and k chosen
on dev documents only — never on these) summarise the same held-out documents of two domains, and each claim of the
gated mode is read from paired per-document differences (verdicts.paired) into holds / unsettled / does not hold.

    in domain      the adapter's test split (as it was trained), then documents of the same corpus that its data never
                   held (HaluEval's, where the data was built from HaluEval) when the split has fewer than n_id
    out of domain  CLIFF's test cut: XSum and CNN/DM articles, never in the project's data

Per summary: factuality (sentence protocol), supported sentences, log-perplexity under the base model, degenerate,
the tokens the gate replaced and generated, and the share of its tokens the head flags at τ (on the merged model's
summaries: how τ, read on dev text, behaves on each domain). Generations are cached in chunks of `chunk` documents
(evaluate.generations_for), so a killed study resumes from its last finished chunk to the same numbers.

    GatedDomains(run, n_id=64, n_ood=64, chunk=8, n_boot=2000)
    held_out_documents(study, cfg) -> {domain: [EvalDoc]}
    run_study(study, cfg, progress=None, use_cache=True) -> dict     the report (settings, documents, table, verdicts,
                                                                    gate activity, per-document rows)
    markdown(report) -> str
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ...data.halueval import load_halueval_rows
from ...data.records import read_jsonl
from ...data.split import first_documents, split_records
from ...foundations.errors import ConfigError
from ...foundations.metrics import mean_ci
from ...foundations.paths import project_path
from ...training.adapters import open_adapter
from ..evaluation.config import EvalConfig, ProgressFn, Variant
from ..evaluation.documents import EvalDoc, ood_documents
from ..evaluation.gated_comparison import GatedStudy, Scoring
from ..evaluation.recommend import RECOMMEND_COMMAND, recommended
from .verdicts import NOT_REPRODUCED, REPRODUCED, decide, paired

IN_DOMAIN, OUT_OF_DOMAIN = DOMAINS = ("in domain", "out of domain")
VARIANTS = ("merged", "always-on", "gated")
MEASURES = ("factuality", "supported", "log_perplexity", "degenerate", "replaced", "tokens", "flagged_at_tau", "words")
PAIRS = (("gated", "merged"), ("gated", "always-on"), ("always-on", "merged"))
# the gated mode's claims: (measure, variant, against, +1 where higher is the claim's way, the claim)
CLAIMS = (
    ("factuality", "gated", "merged", 1, "gated steering is more factual than the merged model"),
    ("supported", "gated", "merged", 1, "gated summaries carry more supported sentences than the merged model's"),
    ("factuality", "gated", "always-on", 1, "gated steering is more factual than always-on steering"),
    ("log_perplexity", "gated", "always-on", -1, "gated steering is more fluent than always-on steering"),
    ("log_perplexity", "gated", "merged", -1, "gated steering is more fluent than the merged model"),
)
OUTCOMES = {REPRODUCED: "holds", NOT_REPRODUCED: "does not hold"}  # "unsettled" reads as it is


@dataclass(frozen=True)
class GatedDomains:
    run: str
    n_id: int = 64
    n_ood: int = 64
    chunk: int = 8  # documents per cached generation: what a kill can lose
    n_boot: int = 2000

    def __post_init__(self) -> None:
        if self.n_id < 0 or self.n_ood < 0 or self.n_id + self.n_ood == 0 or self.chunk < 1:
            raise ConfigError(f"n_id={self.n_id}, n_ood={self.n_ood}, chunk={self.chunk}: give documents (>= 0 each).")


def held_out_documents(study: GatedDomains, cfg: EvalConfig) -> dict[str, list[EvalDoc]]:
    """The held-out documents of each domain (module docstring)."""
    settings = open_adapter(study.run).settings
    records = read_jsonl(project_path(settings.data))
    test = split_records(records, seed=settings.split_seed)["test"]
    ids = [EvalDoc("ID", r.source, r.doc_id, r.document) for r in first_documents(test, study.n_id)]
    if len(ids) < study.n_id and records and all(r.source.startswith("halueval") for r in records):
        held = {r.document for r in records}  # never trained on, never chosen on: the corpus's other documents
        fresh = (row for row in load_halueval_rows() if row["document"] not in held)
        ids += [EvalDoc("ID", "halueval-unseen", r["doc_id"], r["document"]) for r in fresh][: study.n_id - len(ids)]
    return {IN_DOMAIN: ids, OUT_OF_DOMAIN: ood_documents(replace(cfg, n_ood=study.n_ood), cut="test")}


def _settings(run: str) -> dict:
    rec = recommended(run)
    if rec is None or rec.values.get("tau") is None:
        why = "it has no recommendation" if rec is None else rec.settings[0].source
        raise ConfigError(
            f"{run}: the study compares the gated mode at its recommended τ and λ, and {why}. Run "
            f"`{RECOMMEND_COMMAND} {run}` first (an adapter without a head has no gate)."
        )
    v = rec.values
    return {
        "tau": v["tau"],
        "gated_lambda": v["gated_lambda"],
        "keep": int(v["keep"] or 0),
        "always_on_lambda": v["always_on_lambda"],
        "source": rec.line(),
    }


def run_study(study: GatedDomains, cfg: EvalConfig, progress: ProgressFn | None = None, use_cache: bool = True):
    """Every variant on every document, chunk by chunk (both domains advance together), then the report."""
    s = _settings(study.run)
    compared = GatedStudy(study.run, (s["always_on_lambda"],), (s["tau"],), (s["keep"],))
    variants = {
        "merged": Variant.merged(study.run),
        "always-on": compared.always_on(s["always_on_lambda"]),
        "gated": compared.gated(s["gated_lambda"], s["tau"], s["keep"]),
    }
    docs = held_out_documents(study, cfg)
    scoring = Scoring(compared, cfg, use_cache)
    rows: list[dict] = []
    starts = range(0, max(len(d) for d in docs.values()), study.chunk)
    for i, start in enumerate(starts):
        for domain, domain_docs in docs.items():
            part = domain_docs[start : start + study.chunk]
            for label, v in variants.items() if part else ():
                if progress:
                    progress(f"chunk {i + 1}/{len(starts)}, {domain}: {v.name} on {len(part)} documents")
                rows += [{"domain": domain, **r} for r in scoring.rows(v, part, label, tau=s["tau"])]
    per_doc = pd.DataFrame(rows)
    return {
        "run": study.run,
        "settings": s,
        "generation": {k: getattr(cfg, k) for k in ("max_new_tokens", "max_doc_tokens", "precision", "device")},
        "scorer": cfg.scorer,
        "documents": {d: per_doc[per_doc["domain"] == d].groupby("source")["doc_id"].nunique().to_dict() for d in docs},
        "table": _table(per_doc, study.n_boot),
        "verdicts": _verdicts(per_doc, study.n_boot),
        "gate": _gate_activity(per_doc, s["tau"]),
        "rows": per_doc.to_dict("records"),
    }


def _by_doc(part: pd.DataFrame, measure: str) -> pd.DataFrame:
    return part.set_index(["source", "doc_id", "variant"])[measure].unstack("variant")


def _table(per_doc: pd.DataFrame, n_boot: int) -> list[dict]:
    """Per domain and measure: each variant's mean with its 95% interval, then each pair's paired difference."""
    out = []
    for domain, part in per_doc.groupby("domain", sort=False):
        for measure in MEASURES:
            table = _by_doc(part, measure)
            for v in (v for v in VARIANTS if v in table and table[v].notna().any()):  # (a gate's counts: gated only)
                c = mean_ci(table[v].dropna(), "x")
                out.append({"domain": domain, "measure": measure, "comparison": v, "mean": c["x"]}
                           | {"lo": c["x_lo"], "hi": c["x_hi"], "agree": np.nan, "n": c["x_n"]})  # fmt: skip
            for a, b in (p for p in PAIRS if p[0] in table and p[1] in table):
                c = paired(table[a] - table[b], n_boot)
                if not c.n:
                    continue
                out.append({"domain": domain, "measure": measure, "comparison": f"{a} − {b}", "mean": c.estimate}
                           | {"lo": c.lo, "hi": c.hi, "agree": c.agree, "n": c.n})  # fmt: skip
    return out


def _verdicts(per_doc: pd.DataFrame, n_boot: int) -> list[dict]:
    out = []
    for domain, part in per_doc.groupby("domain", sort=False):
        for measure, a, b, sign, claim in CLAIMS:
            table = _by_doc(part, measure)
            hi, lo = (a, b) if sign > 0 else (b, a)  # the difference taken the claim's way
            c = paired(table[hi] - table[lo], n_boot, name=f"{hi} − {lo} in {measure.replace('_', '-')}")
            this_run = f"{measure.replace('_', '-')}: {a} {table[a].mean():.3f}, {b} {table[b].mean():.3f}"
            verdict, this_run, why = decide(c, this_run, claim, "the difference points the other way")
            out.append({"domain": domain, "claim": claim, "verdict": OUTCOMES.get(verdict, verdict)}
                       | {"this_run": this_run, "why": why, "estimate": c.estimate, "lo": c.lo, "hi": c.hi}
                       | {"agree": c.agree, "n": c.n})  # fmt: skip
    return out


def _gate_activity(per_doc: pd.DataFrame, tau: float) -> dict:
    """Per domain: the share of the merged model's tokens the head flags at τ, and what the gate did per summary."""
    out = {}
    for domain, part in per_doc.groupby("domain", sort=False):
        merged, gated = part[part["variant"] == "merged"], part[part["variant"] == "gated"]
        out[domain] = {
            "tau": tau,
            "flagged_at_tau_merged": float(merged["flagged_at_tau"].mean()),
            "replaced_per_summary": float(gated["replaced"].mean()),
            "summaries_with_a_replacement": int((gated["replaced"] > 0).sum()),
            "summaries": int(len(gated)),
            "tokens_per_summary": float(gated["tokens"].mean()),
        }
    return out


def markdown(report: dict) -> str:
    """The report as Markdown: settings, the gate's activity, the verdicts and the paired table per domain."""
    s, g = report["settings"], report["generation"]
    lines = [
        f"# Gated steering held out, in and out of domain: {report['run']}",
        "",
        f"Settings (never chosen on these documents): {s['source']}.",
        f"Generation: greedy, at most {g['max_new_tokens']} new tokens of documents cut to {g['max_doc_tokens']} "
        f"tokens, {g['precision']} on {g['device']}; factuality by the `{report['scorer']}` scorer.",
        "",
        "| domain | documents | τ flags of the merged model's tokens | tokens replaced per gated summary | "
        "summaries with a replacement |",
        "|---|---|---:|---:|---:|",
    ]
    for domain, gate in report["gate"].items():
        sources = ", ".join(f"{k} {v}" for k, v in report["documents"][domain].items())
        lines.append(
            f"| {domain} | {sources} | {100 * gate['flagged_at_tau_merged']:.1f}% | "
            f"{gate['replaced_per_summary']:.2f} of {gate['tokens_per_summary']:.0f} | "
            f"{gate['summaries_with_a_replacement']} of {gate['summaries']} |"
        )
    lines += ["", "## Verdicts", "", "| domain | claim | verdict | this run | why |", "|---|---|---|---|---|"]
    lines += [
        f"| {v['domain']} | {v['claim']} | **{v['verdict']}** | {v['this_run']} | {v['why']} |"
        for v in report["verdicts"]
    ]
    lines += ["", "## Every measure, paired per document", ""]
    lines += [
        "| domain | measure | comparison | mean [95% interval] | draws above 0 | n |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in report["table"]:
        agree = "" if r["agree"] != r["agree"] else f"{100 * r['agree']:.0f}%"  # NaN: a variant's own mean
        lines.append(
            f"| {r['domain']} | {r['measure']} | {r['comparison']} | {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
            f"| {agree} | {r['n']} |"
        )
    return "\n".join(lines) + "\n"
