"""A reproduction's tables from its tasks' results (reproduce.read_results): training, LoRA-A separability with the
random-init-A control and its per-layer profile, factuality ID / OOD with paired changes against the base model, the
indicator table with Spearman ρ and how far ρ moves under the intervals, the λ curves, label sensitivity and
detection — each with the paper's figures beside this run's where the paper gives them (paper_numbers.py).

    ReportTables      every table (an empty DataFrame where no task measured it), the rank correlation and TOPL's
                      paired OOD comparisons
    report_tables(cfg, results) -> ReportTables
    topl_pairs(per_doc) -> DataFrame   TOPL − every other merged model, per OOD document: factuality, supported
                      sentences
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...foundations.metrics import mean_ci
from ..evaluation.evaluate import results_table, supported_sentences
from ..evaluation.indicator import factuality_columns, indicator_table, rho_interval
from ..evaluation.lambda_study import lambda_curve
from ..evaluation.scorers import PROTOCOLS
from ..lora_a.probe import ProbeResult
from .detection_stats import MEAN_OF_SETS, paired_auroc_draws
from .paper_numbers import INDICATOR
from .reproduce_config import ReproduceConfig
from .verdicts import paired


@dataclass
class ReportTables:
    """Every table of the report (an empty DataFrame where no task measured it) and the rank correlation."""

    training: pd.DataFrame = field(default_factory=pd.DataFrame)
    separability: pd.DataFrame = field(default_factory=pd.DataFrame)
    per_layer: pd.DataFrame = field(default_factory=pd.DataFrame)
    factuality: pd.DataFrame = field(default_factory=pd.DataFrame)
    indicator: pd.DataFrame = field(default_factory=pd.DataFrame)
    lambda_curve: pd.DataFrame = field(default_factory=pd.DataFrame)
    labels: pd.DataFrame = field(default_factory=pd.DataFrame)
    detection: pd.DataFrame = field(default_factory=pd.DataFrame)
    rho: dict = field(default_factory=dict)
    # TOPL against every other merged model on the OOD documents, paired per document (PAIRS_COLUMNS)
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # TOPL's head against TLDR's on the same CLIFF tokens, paired per record resample (HEAD_PAIRS_COLUMNS)
    head_pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the original labels' head against the shuffled labels' on the same validation tokens (HEAD_PAIRS_COLUMNS)
    label_pairs: pd.DataFrame = field(default_factory=pd.DataFrame)


def _rows(results: dict, kind: str, methods) -> list[dict]:
    return [row for m in methods for row in results.get(f"{kind}-{m}", {}).get("rows", [])]


def report_tables(cfg: ReproduceConfig, results: dict[str, dict]) -> ReportTables:
    t = ReportTables()
    t.training = pd.DataFrame([results[f"train-{m}"]["summary"] for m in cfg.methods if f"train-{m}" in results])
    probes = {
        m: ProbeResult.from_json(results[f"separability-{m}"]["probe"])
        for m in cfg.methods
        if f"separability-{m}" in results
    }
    t.separability = pd.DataFrame([_separability_row(m, p) for m, p in probes.items()])
    t.per_layer = _per_layer(probes)
    per_doc = pd.DataFrame(_rows(results, "factuality", ["base", *cfg.methods]))
    if len(per_doc):
        t.factuality = _factuality(per_doc)
        t.indicator, t.rho = _indicator(probes, per_doc)
        t.pairs = topl_pairs(per_doc)
    steered = pd.DataFrame(_rows(results, "lambda", cfg.methods))
    if len(steered):  # lambda_curve sorts by run, mode, λ: the runs (methods) again, in the study's order
        order = {m: i for i, m in enumerate(cfg.methods)}
        curve = lambda_curve(steered).sort_values("run", key=lambda c: c.map(order), kind="stable")
        t.lambda_curve = curve.reset_index(drop=True)
    t.labels = pd.DataFrame(results.get("labels", {}).get("rows", []))
    t.detection = pd.DataFrame(_rows(results, "detection", cfg.methods))
    t.head_pairs = head_pairs(results)
    t.label_pairs = label_pairs(t.labels)
    return t


HEAD_PAIRS_COLUMNS = ["set", "d", "d_lo", "d_hi", "agree", "records"]


def head_pairs(results: dict[str, dict], n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """TOPL's head AUROC minus TLDR's on each CLIFF set both scored (paired_heads), and on the mean over those sets
    (each draw the mean of the sets' draws)."""
    topl, tldr = (results.get(f"detection-{m}", {}).get("heads", {}) for m in ("topl", "tldr"))
    rows, estimates, draws = [], [], []
    for i, name in enumerate(sorted(set(topl) & set(tldr))):
        paired_ = paired_heads(topl[name], tldr[name], n_boot, seed + i)
        if paired_ is not None:  # the same tokens
            rows.append(_draws_row(name, *paired_))
            estimates.append(paired_[0])
            draws.append(paired_[1])
    if rows:
        records = min(r["records"] for r in rows)
        rows.append(_draws_row(MEAN_OF_SETS, float(np.mean(estimates)), np.mean(draws, axis=0), records))
    return pd.DataFrame(rows, columns=HEAD_PAIRS_COLUMNS)


def label_pairs(labels: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The head trained on the original labels minus the one trained on shuffled ("random") labels, both scored on
    the original labels of the same validation tokens (label_sensitivity's val_heads; paired_heads)."""
    if not len(labels) or "val_heads" not in labels.columns:
        return pd.DataFrame(columns=HEAD_PAIRS_COLUMNS)
    heads = labels.set_index("setting")["val_heads"]
    if not {"original", "random"} <= set(heads.index) or not all(
        isinstance(heads[s], dict) for s in ("original", "random")
    ):
        return pd.DataFrame(columns=HEAD_PAIRS_COLUMNS)
    paired_ = paired_heads(heads["original"], heads["random"], n_boot, seed)
    return pd.DataFrame(
        [_draws_row("original − random (val)", *paired_)] if paired_ else [], columns=HEAD_PAIRS_COLUMNS
    )


def paired_heads(a: dict, b: dict, n_boot: int, seed: int) -> tuple[float, np.ndarray, int] | None:
    """AUROC(a's head) − AUROC(b's) on the same labelled tokens (a dict each: record, bad, head), the difference in each
    of `n_boot` record resamples drawn the same for both (detection_stats.paired_auroc_draws) and the records; None
    where the two were not scored on the same tokens."""
    if a["record"] != b["record"] or a["bad"] != b["bad"]:
        return None
    arrays = [np.asarray(x) for x in (a["bad"], a["head"], b["head"], a["record"])]
    d, draws = paired_auroc_draws(*arrays, n=n_boot, seed=seed)
    return d, draws, len(set(a["record"]))


def _draws_row(name: str, d: float, draws: np.ndarray, records: int) -> dict:
    """A paired difference as a row: the 2.5–97.5 percentiles of its finite draws and the share above 0."""
    draws = draws[np.isfinite(draws)]
    lo, hi = np.percentile(draws, [2.5, 97.5]) if len(draws) else (math.nan, math.nan)
    agree = float((draws > 0).mean()) if len(draws) else math.nan
    return {"set": name, "d": d, "d_lo": float(lo), "d_hi": float(hi), "agree": agree, "records": records}


def _separability_row(method: str, p: ProbeResult) -> dict:
    s, c, paper = p.lora, p.control, INDICATOR.get(method)
    nan = math.nan
    return {
        "method": method,
        "sites": len(s.scores),
        "tokens": s.n_tokens,
        "bad": s.n_bad,
        "mean": s.mean,
        "std": s.std,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "control_mean": c.mean if c else nan,
        "control_low": c.ci_low if c else nan,
        "control_high": c.ci_high if c else nan,
        "paper_mean": paper.lora_a_mean if paper else nan,
        "paper_std": paper.lora_a_std if paper else nan,
    }


def _per_layer(probes: dict[str, ProbeResult]) -> pd.DataFrame:
    """Mean LoRA-A AUROC over a layer's sites, per method (columns), and the random-init A of the first method."""
    cols = {m: p.lora.heatmap().mean(axis=1) for m, p in probes.items()}
    first = next(iter(probes.values()), None)
    if first is not None and first.control is not None:
        cols[f"random-init A ({next(iter(probes))})"] = first.control.heatmap().mean(axis=1)
    return pd.DataFrame(cols)


def _factuality(per_doc: pd.DataFrame) -> pd.DataFrame:
    """Per variant and protocol: ID, OOD, average, sentences (all and OOD), supported sentences per OOD summary (a
    length-aware measure: evaluate.supported_sentences), and the paired change against the base model on the same
    documents with its 95% interval."""
    out = []
    ood_docs = per_doc[per_doc["set"] == "OOD"]
    ood = ood_docs.groupby("variant")["n_sentences"].mean()
    supported = supported_sentences(ood_docs).groupby(ood_docs["variant"]).mean()
    for protocol in PROTOCOLS:
        col, table = f"score_{protocol}", results_table(per_doc, protocol)
        base = per_doc[per_doc["variant"] == "base"].set_index(["set", "doc_id"])[col]
        for variant, r in table.iterrows():
            row = {"variant": variant, "protocol": protocol, **r.to_dict(), "ood_sentences": ood.get(variant, math.nan)}
            row["ood_supported"] = supported.get(variant, math.nan)
            mine = per_doc[per_doc["variant"] == variant].set_index(["set", "doc_id"])[col]
            for s in ("ID", "OOD"):
                diff = (mine - base.reindex(mine.index)).xs(s, level="set", drop_level=False).dropna()
                ci = mean_ci(diff, "d")
                row.update({f"d_{s}": ci["d"], f"d_{s}_lo": ci["d_lo"], f"d_{s}_hi": ci["d_hi"]})
            paper = INDICATOR.get(variant)
            row["paper_ood"] = paper.ood_factuality if paper else math.nan
            out.append(row)
    return pd.DataFrame(out)


PAIRS_COLUMNS = ["other", "measure", "d", "d_lo", "d_hi", "agree", "n"]
PAIR_MEASURES = {"factuality": "score_sentence", "supported": "supported"}  # the claims' two OOD comparisons


def topl_pairs(per_doc: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """TOPL against every other merged model on the OOD documents both summarised, paired per document: the mean
    difference (TOPL − other) of the sentence protocol's factuality and of the supported sentences per summary, its
    95% interval from `n_boot` paired resamples of the documents (verdicts.paired), the share of them in which TOPL
    is above, and the documents."""
    ood = per_doc[per_doc["set"] == "OOD"].assign(supported=supported_sentences)
    by = {v: part.set_index(["source", "doc_id"]) for v, part in ood.groupby("variant")}
    if "topl" not in by:
        return pd.DataFrame(columns=PAIRS_COLUMNS)
    rows = []
    for other in (v for v in dict.fromkeys(ood["variant"]) if v not in ("topl", "base")):
        for measure, col in PAIR_MEASURES.items():
            c = paired(by["topl"][col] - by[other][col].reindex(by["topl"].index), n_boot, seed)
            rows.append({"other": other, "measure": measure, "d": c.estimate, "d_lo": c.lo, "d_hi": c.hi}
                        | {"agree": c.agree, "n": c.n})  # fmt: skip
    return pd.DataFrame(rows, columns=PAIRS_COLUMNS)


def _indicator(probes: dict[str, ProbeResult], per_doc: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    methods = [m for m in probes if m in set(per_doc["variant"])]
    if not methods:
        return pd.DataFrame(), {}
    control = probes[methods[0]].control
    table, rho = indicator_table({m: probes[m].lora for m in methods}, factuality_columns(per_doc), control)
    table["paper_lora_a"] = table["method"].map(
        {m: f"{r.lora_a_mean:.4f} ± {r.lora_a_std:.4f}" for m, r in INDICATOR.items()}
    )
    table["paper_ood"] = table["method"].map({m: r.ood_factuality for m, r in INDICATOR.items()})
    ood = per_doc[per_doc["set"] == "OOD"].sort_values(["source", "doc_id"])
    scores = {m: ood[ood["variant"] == m]["score_sentence"].tolist() for m in methods}
    sites = {m: [s.cv_auroc for s in probes[m].lora.scores] for m in methods}
    spread = rho_interval(sites, {m: v for m, v in scores.items() if v})
    return table, {"rho": rho["ood_factuality"], "rho_id": rho["id_factuality"], "methods": len(methods), **spread}
