"""The paper's claims a reproduction judges, each with its source, what the paper says (paper_numbers.py) and the rule
that reads this run's tables (reproduce_report.ReportTables) into a verdict: reproduced in direction (this run's
figures point the same way), not reproduced (they point the other way), or not measurable here (a method or measure
the claim needs is missing) — each with why, intervals included. A direction is read from the point estimates; the
why says whether the 95% intervals settle it.

    CLAIMS                       the claims, in the report's order
    judge(tables) -> [Verdict]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .paper_numbers import INDICATOR, INDICATOR_SOURCE, LABEL_SOURCE, LAMBDA_SOURCE, LAYER_SOURCE

if TYPE_CHECKING:  # annotations only: the report imports this module
    from .reproduce_tables import ReportTables

VERDICTS: tuple[str, ...] = ("reproduced in direction", "not reproduced", "not measurable here")
REPRODUCED, NOT_REPRODUCED, NOT_MEASURABLE = VERDICTS
Judged = tuple[str, str, str]  # (verdict, this run's figures, why)


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


def _ci(mean: float, lo: float, hi: float) -> str:
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


def _direction(holds: bool, this_run: str, settled: bool | None, held: str, failed: str) -> Judged:
    """The verdict of a direction, and whether the intervals settle it (None: no interval is computed for it)."""
    how = {
        True: "the 95% intervals settle it",
        False: "the 95% intervals overlap, so this run does not settle it",
        None: "no interval is computed for this comparison",
    }[settled]
    return (REPRODUCED, this_run, f"{held}; {how}") if holds else (NOT_REPRODUCED, this_run, f"{failed}; {how}")


def _topl_separates_most(t: "ReportTables") -> Judged:
    sep = t.separability.set_index("method") if len(t.separability) else None
    if sep is None or "topl" not in sep.index or len(sep) < 2:
        return NOT_MEASURABLE, "—", "needs TOPL and at least one other method probed"
    topl, best = sep.loc["topl"], sep.drop(index="topl")["mean"].idxmax()
    other = sep.loc[best]
    this_run = f"TOPL {_ci(topl['mean'], topl.ci_low, topl.ci_high)}; best other {best} {other['mean']:.3f}"
    settled = topl.ci_low > other.ci_high or topl.ci_high < other.ci_low
    return _direction(topl["mean"] > other["mean"], this_run, settled, "TOPL's mean is the highest", f"{best} is above")


def _topl_above_random_a(t: "ReportTables") -> Judged:
    sep = t.separability.set_index("method") if len(t.separability) else None
    if sep is None or "topl" not in sep.index or math.isnan(sep.loc["topl", "control_mean"]):
        return NOT_MEASURABLE, "—", "needs TOPL probed with its random-init-A control"
    r = sep.loc["topl"]
    control = _ci(r.control_mean, r.control_low, r.control_high)
    this_run = f"TOPL {_ci(r['mean'], r.ci_low, r.ci_high)}; random-init A {control}"
    settled = r.ci_low > r.control_high or r.ci_high < r.control_low
    return _direction(r["mean"] > r.control_mean, this_run, settled, "trained A above random A", "random A not below")


def _separability_ranks_ood(t: "ReportTables") -> Judged:
    rho = t.rho
    if math.isnan(rho.get("rho", math.nan)):
        return NOT_MEASURABLE, "—", "needs at least three methods with both LoRA-A separability and OOD factuality"
    this_run = f"ρ = {rho['rho']:+.2f} over {rho['methods']} methods"
    spread = (
        f"under the intervals ρ lies in [{rho['lo']:+.2f}, {rho['hi']:+.2f}] (95% of bootstrap draws of sites and "
        f"documents), positive in {100 * rho['positive']:.0f}% of them"
    )
    settled = rho["lo"] > 0 or rho["hi"] < 0
    verdict = REPRODUCED if rho["rho"] > 0 else NOT_REPRODUCED
    return verdict, this_run, spread + ("" if settled else "; the sign is not settled")


def _topl_most_factual_ood(t: "ReportTables") -> Judged:
    f = t.factuality
    rows = f[(f["protocol"] == "sentence") & (f["variant"] != "base")].set_index("variant") if len(f) else None
    if rows is None or "topl" not in rows.index or len(rows) < 2 or math.isnan(rows.loc["topl", "OOD"]):
        return NOT_MEASURABLE, "—", "needs TOPL and another method evaluated on OOD documents"
    best = rows.drop(index="topl")["OOD"].idxmax()
    topl, other = rows.loc["topl"], rows.loc[best]
    change = f"{topl.d_OOD:+.3f} [{topl.d_OOD_lo:+.3f}, {topl.d_OOD_hi:+.3f}]"
    this_run = f"TOPL {topl.OOD:.3f} (against the base model {change}); {best} {other.OOD:.3f}"
    settled = topl.d_OOD_lo > other.d_OOD_hi or topl.d_OOD_hi < other.d_OOD_lo
    return _direction(
        topl.OOD > other.OOD, this_run, settled, "TOPL's OOD factuality is the highest", f"{best} is above"
    )


def _curve(t: "ReportTables", method: str):
    c = t.lambda_curve
    if not len(c):
        return None
    part = c[(c["run"] == method) & (c["mode"] == "vector")].sort_values("lambda")
    return part if len(part) >= 3 else None


def _topl_rises_then_falls(t: "ReportTables") -> Judged:
    c = _curve(t, "topl")
    if c is None:
        return NOT_MEASURABLE, "—", "needs TOPL's LoRA-B vector steered at three λ values or more"
    peak = int(c["factuality"].to_numpy().argmax())
    at = c.iloc[peak]
    first, last = c.iloc[0], c.iloc[-1]
    ends = f"λ = {first['lambda']:g}: {first.factuality:.3f}, λ = {last['lambda']:g}: {last.factuality:.3f}"
    this_run = f"peak {at.factuality:.3f} at λ = {at['lambda']:g} ({ends})"
    settled = at.change_lo > 0 if not math.isnan(at.change_lo) else False
    inside = 0 < peak < len(c) - 1
    held = "the curve peaks inside the grid"
    return _direction(inside, this_run, settled, held, "the curve peaks at an end of the grid")


def _sft_flatter(t: "ReportTables") -> Judged:
    topl, sft = _curve(t, "topl"), _curve(t, "sft")
    if topl is None or sft is None:
        return NOT_MEASURABLE, "—", "needs the λ curves of both TOPL and SFT"
    span = {k: float(c["factuality"].max() - c["factuality"].min()) for k, c in (("TOPL", topl), ("SFT", sft))}
    this_run = f"range of factuality over λ: TOPL {span['TOPL']:.3f}, SFT {span['SFT']:.3f}"
    half_width = float(((sft["factuality_hi"] - sft["factuality_lo"]) / 2).mean())
    settled = span["TOPL"] - span["SFT"] > half_width
    return _direction(span["SFT"] < span["TOPL"], this_run, settled, "SFT's curve spans less", "SFT's spans more")


def _labels_matter(t: "ReportTables") -> Judged:
    lab = t.labels.set_index("setting") if len(t.labels) else None
    if lab is None or not {"original", "random"} <= set(lab.index):
        return NOT_MEASURABLE, "—", "needs the original and random label settings trained"
    o, r = lab.loc["original", "val_token_auroc"], lab.loc["random", "val_token_auroc"]
    this_run = f"head token AUROC (val): original {o:.3f}, random {r:.3f}"
    return _direction(o > r, this_run, None, "the original labels teach more", "shuffled labels teach as much")


def _topl_head_beats_tldr(t: "ReportTables") -> Judged:
    d = t.detection
    heads = d[(d["detector"] == "head") & d["set"].str.startswith("cliff-")] if len(d) else d
    means = heads.groupby("adapter")["auroc"].mean() if len(heads) else {}
    if not {"topl", "tldr"} <= set(getattr(means, "index", ())):
        return NOT_MEASURABLE, "—", "needs the TOPL and TLDR heads scored on CLIFF's test cut"
    this_run = f"head AUROC, mean over CLIFF's test sets: TOPL {means['topl']:.3f}, TLDR {means['tldr']:.3f}"
    return _direction(
        means["topl"] >= means["tldr"], this_run, None, "the head after layer m detects at least as well",
        "the last layer's head detects better",
    )  # fmt: skip


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
        "A head after an intermediate layer (TOPL) detects at least as well as one on the last layer (TLDR)",
        LAYER_SOURCE + " (our reading, on CLIFF's held-out spans)",
        "middle layers help most",
        _topl_head_beats_tldr,
    ),
)


def judge(tables: "ReportTables") -> list[Verdict]:
    return [c.verdict(tables) for c in CLAIMS]
