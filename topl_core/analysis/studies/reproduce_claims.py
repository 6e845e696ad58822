"""The paper's claims a reproduction judges, each with its source, what the paper says (paper_numbers.py) and the rule
that reads this run's tables (reproduce_report.ReportTables) into one of four verdicts, with why:

    reproduced           the claim's direction holds and its 95% interval excludes the opposite direction
    unsettled            the point estimate points the claim's way but the interval does not settle it (or none is
                         computed): the why says how often the bootstrap (or the normal approximation of the
                         intervals) agrees, and how many documents would settle a difference of the observed size
    not reproduced       the point estimate points the other way (the why says whether the interval settles that)
    not measurable here  a method or measure the claim needs is missing

    CLAIMS                       the claims, in the report's order
    Comparison                   a claim's difference, in its direction, with its interval, agreement and sample size
    documents_to_settle(c) -> int | None   the power estimate (80% power, two-sided 95% interval)
    judge(tables) -> [Verdict]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .detection_stats import MEAN_OF_SETS
from .paper_numbers import INDICATOR, INDICATOR_SOURCE, LABEL_SOURCE, LAMBDA_SOURCE, LAYER_SOURCE
from .verdicts import (
    NAN,
    NOT_MEASURABLE,
    NOT_REPRODUCED,
    UNSETTLED,
    Comparison,
    Judged,
    decide,
    from_intervals,
    normal_share,
    se_of,
)

if TYPE_CHECKING:  # annotations only: the report imports this module
    from .reproduce_tables import ReportTables


def _ci(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


@dataclass(frozen=True)
class Verdict:
    claim: str
    source: str
    paper: str
    this_run: str
    verdict: str
    why: str


@dataclass(frozen=True)
class Claim:
    statement: str
    source: str
    paper: str
    judge: Callable[["ReportTables"], Judged]

    def verdict(self, tables: "ReportTables") -> Verdict:
        verdict, this_run, why = self.judge(tables)
        return Verdict(self.statement, self.source, self.paper, this_run, verdict, why)


def _topl_separates_most(t: "ReportTables") -> Judged:
    sep = t.separability.set_index("method") if len(t.separability) else None
    if sep is None or "topl" not in sep.index or len(sep) < 2:
        return NOT_MEASURABLE, "—", "needs TOPL and at least one other method probed"
    topl, best = sep.loc["topl"], sep.drop(index="topl")["mean"].idxmax()
    other = sep.loc[best]
    this_run = f"TOPL {_ci(topl['mean'], topl.ci_low, topl.ci_high)}; best other {best} {other['mean']:.3f}"
    ses = [se_of(topl.ci_low, topl.ci_high), se_of(other.ci_low, other.ci_high)]
    c = from_intervals(topl["mean"] - other["mean"], ses, no_power=SITES)
    return decide(c, this_run, "TOPL's mean is the highest", f"{best} is above")


def _topl_above_random_a(t: "ReportTables") -> Judged:
    sep = t.separability.set_index("method") if len(t.separability) else None
    if sep is None or "topl" not in sep.index or math.isnan(sep.loc["topl", "control_mean"]):
        return NOT_MEASURABLE, "—", "needs TOPL probed with its random-init-A control"
    r = sep.loc["topl"]
    control = _ci(r.control_mean, r.control_low, r.control_high)
    this_run = f"TOPL {_ci(r['mean'], r.ci_low, r.ci_high)}; random-init A {control}"
    ses = [se_of(r.ci_low, r.ci_high), se_of(r.control_low, r.control_high)]
    c = from_intervals(r["mean"] - r.control_mean, ses, no_power=SITES)
    return decide(c, this_run, "trained A above random A", "random A not below")


def _separability_ranks_ood(t: "ReportTables") -> Judged:
    rho = t.rho
    if math.isnan(rho.get("rho", math.nan)):
        return NOT_MEASURABLE, "—", "needs at least three methods with both LoRA-A separability and OOD factuality"
    this_run = f"ρ = {rho['rho']:+.2f} over {rho['methods']} methods"
    positive = rho.get("positive", NAN)  # the share of draws on the claim's side
    how, methods = "of the bootstrap draws of sites and documents", rho["methods"]
    no_power = (
        f"ρ over {methods} methods moves with their sites as well as the documents: no power estimate in documents"
    )
    c = Comparison(rho["rho"], rho.get("lo", NAN), rho.get("hi", NAN), positive, how, name="ρ", no_power=no_power)
    return decide(c, this_run, "ρ is positive", "ρ is not positive")


SITES = "more documents would not narrow it: the interval is over the adapters' LoRA sites"


def _ood_rows(t: "ReportTables", protocol: str = "sentence"):
    f = t.factuality
    return f[(f["protocol"] == protocol) & (f["variant"] != "base")].set_index("variant") if len(f) else None


def _paired(t: "ReportTables", other: str, measure: str) -> Comparison | None:
    """TOPL − `other` on the OOD documents, paired per document (report_tables' `pairs`), when the report has it."""
    p = t.pairs
    if not len(p):
        return None
    row = p[(p["other"] == other) & (p["measure"] == measure)]
    if not len(row):
        return None
    r = row.iloc[0]
    return Comparison(r.d, r.d_lo, r.d_hi, r.agree, "of the bootstrap draws of documents", int(r.n))


def _topl_most_factual_ood(t: "ReportTables") -> Judged:
    rows = _ood_rows(t)
    if rows is None or "topl" not in rows.index or len(rows) < 2 or math.isnan(rows.loc["topl", "OOD"]):
        return NOT_MEASURABLE, "—", "needs TOPL and another method evaluated on OOD documents"
    best = rows.drop(index="topl")["OOD"].idxmax()
    topl, other = rows.loc["topl"], rows.loc[best]
    change = f"{topl.d_OOD:+.3f} [{topl.d_OOD_lo:+.3f}, {topl.d_OOD_hi:+.3f}]"
    lengths = f"; sentences per OOD summary: TOPL {topl.ood_sentences:.2f}, {best} {other.ood_sentences:.2f}"
    this_run = f"TOPL {topl.OOD:.3f} (against the base model {change}); {best} {other.OOD:.3f}" + lengths
    c = _paired(t, best, "factuality")
    if c is None:  # a report rebuilt from its tables: each method's change against the base model, as if independent
        n = int(topl.n_OOD) if "n_OOD" in rows.columns and math.isfinite(topl.n_OOD) else None
        ses = [se_of(topl.d_OOD_lo, topl.d_OOD_hi), se_of(other.d_OOD_lo, other.d_OOD_hi)]
        c = from_intervals(topl.OOD - other.OOD, ses, n)
    return decide(c, this_run, "TOPL's OOD factuality is the highest", f"{best} is above")


def _topl_most_supported_ood(t: "ReportTables") -> Judged:
    rows = _ood_rows(t)
    if rows is None or "ood_supported" not in rows.columns or "topl" not in rows.index or len(rows) < 2:
        return NOT_MEASURABLE, "—", "needs each OOD summary's sentence scores (TOPL and another method)"
    if math.isnan(rows.loc["topl", "ood_supported"]):
        return NOT_MEASURABLE, "—", "needs each OOD summary's sentence scores (TOPL and another method)"
    best = rows.drop(index="topl")["ood_supported"].idxmax()
    topl, other = rows.loc["topl"], rows.loc[best]
    this_run = (
        f"supported sentences per OOD summary: TOPL {topl.ood_supported:.2f} of {topl.ood_sentences:.2f}, "
        f"{best} {other.ood_supported:.2f} of {other.ood_sentences:.2f}"
    )
    c = _paired(t, best, "supported")
    if c is None:
        return NOT_MEASURABLE, this_run, "needs the per-document scores to pair the two methods"
    return decide(c, this_run, "TOPL's summaries carry the most supported sentences", f"{best}'s carry more")


def _curve(t: "ReportTables", method: str):
    c = t.lambda_curve
    if not len(c):
        return None
    part = c[(c["run"] == method) & (c["mode"] == "vector")].sort_values("lambda")
    return part if len(part) >= 3 else None


def _documents(c) -> int | None:
    n = c["factuality_n"].min() if "factuality_n" in c.columns else NAN
    return int(n) if math.isfinite(n) else None


def _topl_rises_then_falls(t: "ReportTables") -> Judged:
    c = _curve(t, "topl")
    if c is None:
        return NOT_MEASURABLE, "—", "needs TOPL's LoRA-B vector steered at three λ values or more"
    peak = int(c["factuality"].to_numpy().argmax())
    at = c.iloc[peak]
    first, last = c.iloc[0], c.iloc[-1]
    ends = f"λ = {first['lambda']:g}: {first.factuality:.3f}, λ = {last['lambda']:g}: {last.factuality:.3f}"
    this_run = f"peak {at.factuality:.3f} at λ = {at['lambda']:g} ({ends})"
    if not 0 < peak < len(c) - 1:
        return NOT_REPRODUCED, this_run, "the curve peaks at an end of the grid"
    # the rise: the peak against the neutral λ (the merged model), paired over the same documents
    lo, hi = at.get("change_lo", NAN), at.get("change_hi", NAN)
    change = at.get("change", NAN)
    change = (lo + hi) / 2 if not math.isfinite(change) and math.isfinite(lo) and math.isfinite(hi) else change
    rise = Comparison(
        change, lo, hi, normal_share(change, se_of(lo, hi)), "under the normal approximation", _documents(c)
    )
    held = "the curve peaks inside the grid, above the neutral λ"
    return decide(rise, this_run, held, "the peak is not above the neutral λ")


def _span(c) -> tuple[float, float]:
    """A curve's range of factuality (max − min) and its standard error from the two points' intervals."""
    top, bottom = c.loc[c["factuality"].idxmax()], c.loc[c["factuality"].idxmin()]
    ses = [se_of(x.factuality_lo, x.factuality_hi) for x in (top, bottom)]
    return float(top.factuality - bottom.factuality), math.sqrt(sum(x * x for x in ses))


def _sft_flatter(t: "ReportTables") -> Judged:
    topl, sft = _curve(t, "topl"), _curve(t, "sft")
    if topl is None or sft is None:
        return NOT_MEASURABLE, "—", "needs the λ curves of both TOPL and SFT"
    (span_t, se_t), (span_s, se_s) = _span(topl), _span(sft)
    this_run = f"range of factuality over λ: TOPL {span_t:.3f}, SFT {span_s:.3f}"
    c = from_intervals(span_t - span_s, [se_t, se_s], _documents(topl))
    return decide(c, this_run, "SFT's curve spans less", "SFT's spans more")


def _labels_matter(t: "ReportTables") -> Judged:
    lab = t.labels.set_index("setting") if len(t.labels) else None
    if lab is None or not {"original", "random"} <= set(lab.index):
        return NOT_MEASURABLE, "—", "needs the original and random label settings trained"
    o, r = lab.loc["original", "val_token_auroc"], lab.loc["random", "val_token_auroc"]
    this_run = f"head token AUROC (val): original {o:.3f}, random {r:.3f}"
    held, failed = "the original labels teach more", "shuffled labels teach as much"
    if len(t.label_pairs):  # both heads on the same validation tokens, records resampled the same for both
        p = t.label_pairs.iloc[0]
        c = Comparison(p.d, p.d_lo, p.d_hi, p.agree, "of the paired bootstrap draws of records", int(p.records),
                       "validation records")  # fmt: skip
        return decide(c, this_run + f" (paired on {int(p.records)} records: {p.d:+.3f})", held, failed)
    why = decide(Comparison(o - r), this_run, held, failed)
    return why[0], why[1], why[2] + (" (the label study scores each setting once)" if why[0] == UNSETTLED else "")


def _topl_head_beats_tldr(t: "ReportTables") -> Judged:
    d = t.detection
    heads = d[(d["detector"] == "head") & d["set"].str.startswith("cliff-")] if len(d) else d
    means = heads.groupby("adapter")["auroc"].mean() if len(heads) else {}
    if not {"topl", "tldr"} <= set(getattr(means, "index", ())):
        return NOT_MEASURABLE, "—", "needs the TOPL and TLDR heads scored on CLIFF's test cut"
    this_run = f"head AUROC, mean over CLIFF's test sets: TOPL {means['topl']:.3f}, TLDR {means['tldr']:.3f}"
    by_set = heads.set_index(["adapter", "set"])
    sets = sorted(set(heads[heads["adapter"] == "topl"]["set"]) & set(heads[heads["adapter"] == "tldr"]["set"]))
    ses = [
        se_of(by_set.loc[(m, s), "ci_low"], by_set.loc[(m, s), "ci_high"]) / len(sets)
        for s in sets
        for m in ("topl", "tldr")
    ]
    records = int(heads["records"].min()) if "records" in heads.columns else None
    paired = t.head_pairs[t.head_pairs["set"] == MEAN_OF_SETS] if len(t.head_pairs) else t.head_pairs
    if len(paired):  # the same tokens and record resamples for both heads
        r = paired.iloc[0]
        c = Comparison(r.d, r.d_lo, r.d_hi, r.agree, "of the paired bootstrap draws of records", int(r.records),
                       "records per set")  # fmt: skip
    else:  # a report rebuilt from its tables: each head's interval, as if independent
        c = from_intervals(float(means["topl"] - means["tldr"]), ses, records, "records per set")
    return decide(c, this_run, "the head after layer m detects better", "the last layer's head detects better")


def _paper_rho() -> float:
    from scipy.stats import spearmanr

    return float(
        spearmanr([r.lora_a_mean for r in INDICATOR.values()], [r.ood_factuality for r in INDICATOR.values()])[0]
    )


PAPER_RHO = _paper_rho()
_P = INDICATOR
CLAIMS: tuple[Claim, ...] = (
    Claim(
        "TOPL's LoRA-A separates good from bad tokens better than every other method's",
        INDICATOR_SOURCE,
        f"TOPL {_P['topl'].lora_a_mean:.3f} ± {_P['topl'].lora_a_std:.3f}; SFT {_P['sft'].lora_a_mean:.3f}, "
        f"SOPL {_P['sopl'].lora_a_mean:.3f}, DPO {_P['dpo'].lora_a_mean:.3f}",
        _topl_separates_most,
    ),
    Claim(
        "TOPL's LoRA-A separates beyond a random-init A on the same inputs",
        "the paper's LoRA-A analysis, read against the random-init-A control (docs/design.md §3)",
        f"TOPL {_P['topl'].lora_a_mean:.3f}; the control's value is not in this repository",
        _topl_above_random_a,
    ),
    Claim(
        "Methods with stronger LoRA-A separability generalize better OOD",
        INDICATOR_SOURCE,
        f"Spearman ρ = {PAPER_RHO:+.2f} over SOPL, DPO, SFT, TOPL (computed from the table)",
        _separability_ranks_ood,
    ),
    Claim(
        "TOPL's merged model is the most factual OOD",
        INDICATOR_SOURCE,
        f"TOPL {_P['topl'].ood_factuality:.4f}; SFT {_P['sft'].ood_factuality:.4f}, "
        f"DPO {_P['dpo'].ood_factuality:.4f}, SOPL {_P['sopl'].ood_factuality:.4f}",
        _topl_most_factual_ood,
    ),
    Claim(
        "TOPL's merged model is the most factual OOD, counting supported sentences (a measure that does not reward "
        "shorter summaries)",
        INDICATOR_SOURCE + " (our length-aware reading)",
        "the paper reports the average sentence count beside factuality (length analysis)",
        _topl_most_supported_ood,
    ),
    Claim(
        "TOPL's factuality rises then falls as λ goes from negative to positive",
        LAMBDA_SOURCE,
        "an inverted U along λ (figure; its values are not in this repository)",
        _topl_rises_then_falls,
    ),
    Claim("SFT's λ curve is flatter than TOPL's", LAMBDA_SOURCE, "SFT responds far less (figure)", _sft_flatter),
    Claim(
        "TOPL learns from its token labels: the original labels teach more than shuffled ones",
        LABEL_SOURCE + " (our reading)",
        "the table's figures are not in this repository",
        _labels_matter,
    ),
    Claim(
        "A head after an intermediate layer (TOPL) detects better than one on the last layer (TLDR)",
        LAYER_SOURCE + " (our reading, on CLIFF's held-out spans)",
        "middle layers help most",
        _topl_head_beats_tldr,
    ),
)


def judge(tables: "ReportTables") -> list[Verdict]:
    return [c.verdict(tables) for c in CLAIMS]
