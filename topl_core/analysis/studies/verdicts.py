"""A comparison read into one of three verdicts, the same way wherever a study judges a claim (the paper's claims in
reproduce_claims.py, the gated study's in gated_study.py):

    holds (REPRODUCED)       the estimate points the claim's way and its 95% interval excludes the opposite direction
    unsettled                only the point estimate does: the why says how often the resamples agree and how many
                             documents would settle a difference of the observed size (80% power)
    does not hold (NOT_REPRODUCED)   the estimate points the other way (the why says whether the interval settles it)

    Comparison(estimate, lo, hi, agree, agree_how, n, unit, name, no_power)
    paired(diff, n_boot, seed) -> Comparison     per-document differences: their mean, bootstrap interval, agreement
    from_intervals(estimate, ses, n) -> Comparison    parts with their own intervals, taken as independent
    documents_to_settle(c) -> int | None         the power estimate
    decide(c, this_run, held, failed) -> (verdict, this_run, why)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VERDICTS: tuple[str, ...] = ("reproduced", "unsettled", "not reproduced", "not measurable here")
REPRODUCED, UNSETTLED, NOT_REPRODUCED, NOT_MEASURABLE = VERDICTS
Judged = tuple[str, str, str]  # (verdict, this run's figures, why)
Z95 = 1.959964  # two-sided 95%
Z_POWER = 0.841621  # 80% power
NAN = math.nan
# fewer documents than this give no interval: a percentile bootstrap of a handful of values is far too narrow (two
# documents' resampled means never leave the two values' range)
MIN_PAIRED = 8


@dataclass(frozen=True)
class Comparison:
    """A claim's difference in the claim's direction (estimate > 0: the claim holds at the point estimate), its 95%
    interval (NaN: none computed), the share of resamples on the claim's side (`agree`, whatever the estimate's
    sign; `agree_how` says whose: bootstrap draws, or the normal approximation of intervals) and the documents (or
    records: `unit`) behind the interval — None where more of them would not narrow it (an interval over an
    adapter's sites; `no_power` says so)."""

    estimate: float
    lo: float = NAN
    hi: float = NAN
    agree: float = NAN
    agree_how: str = "of the bootstrap draws"
    n: int | None = None
    unit: str = "documents"
    name: str = "difference"  # what the estimate is, as the why names it
    no_power: str = ""  # why no number of documents is given, where n is None

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def se(self) -> float:
        return (self.hi - self.lo) / (2 * Z95) if self.has_interval else NAN


def normal_share(estimate: float, se: float) -> float:
    """The share of a normal(estimate, se) above 0: how often resamples agree with the estimate's sign."""
    if not (math.isfinite(se) and se > 0):
        return NAN
    return 0.5 * (1 + math.erf(estimate / se / math.sqrt(2)))


def from_intervals(
    estimate: float, ses: list[float], n: int | None = None, unit: str = "documents", no_power: str = ""
) -> Comparison:
    """A difference whose parts come with their own 95% intervals (their standard errors `ses`), taken as
    independent: the interval of the difference by the normal approximation — wider than a paired one where the
    parts share documents, so conservative."""
    se = math.sqrt(sum(x * x for x in ses)) if ses and all(math.isfinite(x) for x in ses) else NAN
    lo, hi = (estimate - Z95 * se, estimate + Z95 * se) if math.isfinite(se) else (NAN, NAN)
    how = "under the normal approximation of the intervals (taken as independent)"
    return Comparison(estimate, lo, hi, normal_share(estimate, se), how, n, unit, no_power=no_power)


def se_of(lo: float, hi: float) -> float:
    return (hi - lo) / (2 * Z95) if math.isfinite(lo) and math.isfinite(hi) else NAN


def documents_to_settle(c: Comparison) -> int | None:
    """How many documents (or records) would give a 95% interval that excludes zero for a true difference of the
    observed size, with 80% power: n · ((z₉₅ + z₈₀) · s.e. / |estimate|)², the standard error scaled as 1/√n. None
    without an interval, a sample size or a difference."""
    if c.n is None or not c.has_interval or c.se <= 0 or c.estimate == 0:
        return None
    return math.ceil(c.n * ((Z95 + Z_POWER) * c.se / abs(c.estimate)) ** 2)


def _interval(c: Comparison) -> str:
    return f"{c.name} {c.estimate:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]"


def _agreement(c: Comparison) -> str:
    return f"{100 * c.agree:.0f}% {c.agree_how} agree" if math.isfinite(c.agree) else ""


def _power(c: Comparison) -> str:
    n = documents_to_settle(c)
    if n is None:
        return c.no_power if c.n is None else ""
    return f"about {n:,} {c.unit} (now {c.n}) would settle a {c.name} of this size with 80% power"


def decide(c: Comparison, this_run: str, held: str, failed: str) -> Judged:
    """The verdict of a comparison: reproduced when the estimate points the claim's way and its interval excludes the
    opposite; unsettled when only the estimate does (how often the resamples agree, and the power estimate); not
    reproduced when the estimate points the other way."""
    parts = lambda *xs: "; ".join(x for x in xs if x)  # noqa: E731
    interval = _interval(c) if c.has_interval else ""
    if c.estimate > 0 and c.has_interval and c.lo > 0:
        return REPRODUCED, this_run, parts(held, interval + ": the 95% interval excludes the opposite direction")
    if c.estimate > 0:
        unsettled = (interval + ": the 95% interval does not settle it") if interval else "no interval is computed"
        return UNSETTLED, this_run, parts(held + " at the point estimate", unsettled, _agreement(c), _power(c))
    settled = c.has_interval and c.hi < 0
    how = "the 95% interval settles it" if settled else "the 95% interval does not settle it either"
    power = "" if settled else _power(c)  # how many documents would settle it either way
    return NOT_REPRODUCED, this_run, parts(failed, f"{interval}: {how}" if interval else "", _agreement(c), power)


def paired(diff, n_boot: int = 2000, seed: int = 0, unit: str = "documents", name: str = "difference") -> Comparison:
    """A claim's per-document differences (claim's direction: > 0 holds; NaN dropped) as a Comparison: their mean, the
    2.5–97.5 percentiles of `n_boot` resampled means (documents drawn with replacement, the same documents for both
    sides of each difference: a paired bootstrap; none below MIN_PAIRED documents) and the share of resampled means
    above 0."""
    d = np.asarray(diff, dtype=np.float64)
    d = d[np.isfinite(d)]
    if not len(d):
        return Comparison(NAN, n=0, unit=unit, name=name)
    draws = d[np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(draws, [2.5, 97.5]) if len(d) >= MIN_PAIRED else (NAN, NAN)
    agree = float((draws > 0).mean())
    how = "of the bootstrap draws of documents"
    return Comparison(float(d.mean()), float(lo), float(hi), agree, how, len(d), unit, name)
