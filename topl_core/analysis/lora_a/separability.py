"""LoRA-A separability: how well each site's r-dim projection A·x separates good from bad tokens (AUROC).

How the r-dim projection becomes one score (both are reported per site):

  cv_auroc (primary)   5-fold stratified cross-validated logistic regression on the r-dim projection
                       (standardised; L2, C=1 — sklearn LogisticRegression's objective, solved by Newton's
                       method in numpy for speed and tested against sklearn). Folds are grouped by document when the
                       token set has ≥ 5 documents (StratifiedGroupKFold), so the faithful and perturbed versions of a
                       summary never sit on both sides of a split; else plain StratifiedKFold over tokens. Every
                       token gets an out-of-fold score (decision function); the AUROC of those pooled out-of-fold
                       scores (positive = good) is the site's AUROC.
  component_auroc      best single component with sign: max over the r components j of max(AUC_j, 1 − AUC_j),
                       AUC_j = AUROC of good vs bad on component j alone. Chosen in-sample (no held-out step), so
                       it is optimistic by a little; reported with the component index and sign (+1: larger = good).

Across sites: mean ± std (population std, ddof=0) of cv_auroc, and a percentile bootstrap 95% CI of the mean
that resamples *sites* (n_boot draws). Read these against the random-init-A control (same r, A drawn like PEFT's
init, applied to the same inputs x): docs/design.md §3 saw ≈ 0.58 there, not 0.5.

    site_scores(X, y, groups=None, folds=5, seed=0, splits=None) -> (cv_auroc, component_auroc, component, sign)
    cv_splits(y, groups=None, folds=5, seed=0) -> [(train_idx, test_idx)]     (computed once per token set)
    separability(proj, name="", folds=5, seed=0, n_boot=2000, num_layers=None) -> Separability
    Separability.table() / .heatmap(column) / .figure(column) / .summary() / .to_json() / .from_json()
    comparison_table({name: Separability}, ood_scores=None, control=None) -> DataFrame
    format_heatmap(df) -> str

The pipeline that captures the projections from an adapter and caches the results is analysis/probe.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Mapping, Sequence

import numpy as np

from ...foundations.presets import LORA_MODULES
from ...runtime.sites import Site
from ..figures import auroc_heatmap
from .capture import Projections

METHOD = (
    "cv_auroc: 5-fold stratified (grouped by document) cross-validated logistic regression on the standardised "
    "r-dim LoRA-A projection; AUROC of pooled out-of-fold scores, positive = good token. component_auroc: best "
    "single component with sign, max_j max(AUC_j, 1-AUC_j), in-sample. Across sites: mean ± std (ddof=0) and a "
    "95% percentile bootstrap CI of the mean over sites."
)


def rank_auroc(y: np.ndarray, scores: np.ndarray) -> float:
    """AUROC by the Mann–Whitney rank statistic (ties averaged): equal to sklearn's roc_auc_score (tested), and
    fast enough for thousands of calls. Positive class = 1. NaN when a class is missing."""
    from scipy.stats import rankdata

    y = np.asarray(y).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_logistic(
    X: np.ndarray, y: np.ndarray, C: float = 1.0, max_iter: int = 50, tol: float = 1e-10
) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """L2 logistic regression on standardised features, solved by Newton's method: minimises
    C·Σ log-loss + ½‖w‖² with an unpenalised intercept — sklearn's LogisticRegression(C) objective after
    StandardScaler (tested to agree). Returns (w, b, mean, scale); score = ((X − mean) / scale) @ w + b."""
    from scipy.special import expit

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    mean, scale = X.mean(0), X.std(0)
    scale = np.where(scale > 0, scale, 1.0)
    Z = np.hstack([(X - mean) / scale, np.ones((len(X), 1))])
    d = Z.shape[1]
    reg = np.eye(d) / C
    reg[-1, -1] = 0.0
    theta = np.zeros(d)
    for _ in range(max_iter):
        p = expit(Z @ theta)
        grad = Z.T @ (p - y) + reg @ theta
        H = (Z * (p * (1 - p))[:, None]).T @ Z + reg + 1e-12 * np.eye(d)
        step = np.linalg.solve(H, grad)
        theta -= step
        if np.abs(step).max() < tol:
            break
    return theta[:-1], float(theta[-1]), mean, scale


def best_component(X: np.ndarray, y: np.ndarray) -> tuple[float, int, int]:
    """(max_j max(AUC_j, 1 − AUC_j), j, sign): the best single component with its sign (+1: larger = good)."""
    best, comp, sign = float("nan"), -1, 1
    for j in range(X.shape[1]):
        a = rank_auroc(y, X[:, j])
        if math.isnan(a):
            continue
        v, s = (a, 1) if a >= 0.5 else (1 - a, -1)
        if math.isnan(best) or v > best:
            best, comp, sign = v, j, s
    return best, comp, sign


def cv_splits(
    y: np.ndarray, groups: np.ndarray | None = None, folds: int = 5, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (train, test) index pairs of the cross-validation (see the module docstring); [] when a class has
    fewer than 2 tokens. They depend only on labels and groups, so one token set computes them once for all sites."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    y = np.asarray(y).astype(int)
    n_min = int(min((y == 0).sum(), (y == 1).sum()))
    if n_min < 2:
        return []
    k = min(folds, n_min)
    X0 = np.zeros((len(y), 1))
    if groups is not None and len(np.unique(groups)) >= k:
        splits = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed).split(X0, y, groups)
    else:
        splits = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(X0, y)
    return [(tr, te) for tr, te in splits]


def cv_logistic_auroc(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray | None = None,
    folds: int = 5,
    seed: int = 0,
    splits: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> float:
    """AUROC of out-of-fold logistic-regression scores (see the module docstring). NaN when a class is missing."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y).astype(int)
    if splits is None:
        splits = cv_splits(y, groups, folds, seed)
    if not splits:
        return float("nan")
    oof = np.full(len(y), np.nan)
    for train, test in splits:
        if len(np.unique(y[train])) < 2:
            continue  # a fold without both classes (tiny sets): its tokens keep no score
        w, b, mean, scale = fit_logistic(X[train], y[train])
        oof[test] = ((X[test] - mean) / scale) @ w + b
    ok = ~np.isnan(oof)
    return rank_auroc(y[ok], oof[ok])


def site_scores(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray | None = None,
    folds: int = 5,
    seed: int = 0,
    splits: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[float, float, int, int]:
    """(cv_auroc, component_auroc, component, sign) for one site's (n, r) projection and labels 1 good / 0 bad."""
    X = np.asarray(X, dtype=np.float64)
    return (cv_logistic_auroc(X, y, groups, folds, seed, splits), *best_component(X, y))


def bootstrap_mean_ci(
    values: Sequence[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (NaNs dropped)."""
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    if len(v) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class SiteScore:
    site: Site
    cv_auroc: float
    component_auroc: float
    component: int
    sign: int

    def to_json(self) -> dict:
        return {
            **self.site.to_json(),
            "cv_auroc": self.cv_auroc,
            "component_auroc": self.component_auroc,
            "component": self.component,
            "sign": self.sign,
        }

    @classmethod
    def from_json(cls, d: dict) -> "SiteScore":
        return cls(
            Site.from_json(d), float(d["cv_auroc"]), float(d["component_auroc"]), int(d["component"]), int(d["sign"])
        )


def _stats(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    return (float(v.mean()), float(v.std())) if len(v) else (float("nan"), float("nan"))


@dataclass(frozen=True)
class Separability:
    """Per-site AUROCs of one projection set on one token set, with summary statistics.

    Example: ``sep = probe_run(adapter, records).lora; sep.mean, sep.table(), sep.figure()``"""

    name: str
    scores: tuple[SiteScore, ...]
    n_tokens: int
    n_good: int
    n_bad: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    component_mean: float
    component_std: float
    num_layers: int | None = None
    method: str = METHOD

    def by_key(self) -> dict[str, SiteScore]:
        return {s.site.key: s for s in self.scores}

    def table(self):
        """One row per site: layer, module, key, cv_auroc, component_auroc, component, sign."""
        import pandas as pd

        return pd.DataFrame([{"key": s.site.key, **s.to_json()} for s in self.scores])

    def heatmap(self, column: Literal["cv_auroc", "component_auroc"] = "cv_auroc", num_layers: int | None = None):
        """Layer × module DataFrame (rows: layers 0..num_layers−1, columns in LORA_MODULES); NaN where no site."""
        import pandas as pd

        n = num_layers or self.num_layers or (max(s.site.layer for s in self.scores) + 1 if self.scores else 0)
        df = pd.DataFrame(np.nan, index=pd.RangeIndex(n, name="layer"), columns=list(LORA_MODULES))
        for s in self.scores:
            if s.site.layer < n:
                df.loc[s.site.layer, s.site.module] = getattr(s, column)
        return df

    def figure(
        self,
        column: Literal["cv_auroc", "component_auroc"] = "cv_auroc",
        num_layers: int | None = None,
        title: str | None = None,
    ):
        """The layer × module heatmap as a Plotly figure (analysis/figures.auroc_heatmap), titled with the name."""
        return auroc_heatmap(self.heatmap(column, num_layers), self.name if title is None else title)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "sites": len(self.scores),
            "tokens": self.n_tokens,
            "good": self.n_good,
            "bad": self.n_bad,
            "mean": self.mean,
            "std": self.std,
            "ci95": [self.ci_low, self.ci_high],
            "component_mean": self.component_mean,
            "component_std": self.component_std,
        }

    def to_json(self) -> dict:
        d = asdict(self)
        d["scores"] = [s.to_json() for s in self.scores]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Separability":
        return cls(**{**d, "scores": tuple(SiteScore.from_json(s) for s in d["scores"])})


def separability(
    proj: Projections, name: str = "", folds: int = 5, seed: int = 0, n_boot: int = 2000, num_layers: int | None = None
) -> Separability:
    """AUROC of good vs bad tokens at every site of `proj` (unlabelled tokens are dropped)."""
    p = proj.labelled()
    y = p.labels.astype(int)
    splits = cv_splits(y, p.doc_ids, folds, seed)
    scores = []
    for site in p.sites:
        cv, comp, j, sign = site_scores(p[site], y, splits=splits)
        scores.append(SiteScore(site, cv, comp, j, sign))
    mean, std = _stats([s.cv_auroc for s in scores])
    cmean, cstd = _stats([s.component_auroc for s in scores])
    lo, hi = bootstrap_mean_ci([s.cv_auroc for s in scores], n_boot, seed)
    return Separability(
        name,
        tuple(scores),
        int(len(y)),
        int((y == 1).sum()),
        int((y == 0).sum()),
        mean,
        std,
        lo,
        hi,
        cmean,
        cstd,
        num_layers,
    )


def comparison_table(
    results: Mapping[str, Separability],
    ood_scores: Mapping[str, float] | None = None,
    control: Separability | None = None,
):
    """The paper's comparison table: method, LoRA-A AUROC mean ± std (cv), CI, best-component mean, OOD
    factuality score (NaN unless given in ood_scores[name]); the random-A control as a last row when given.

    Example: ``comparison_table({"TOPL": topl.lora, "SFT": sft.lora}, control=topl.control)``"""
    import pandas as pd

    rows = []
    items = list(results.items()) + ([("random-init A (control)", control)] if control is not None else [])
    for name, s in items:
        rows.append(
            {
                "method": name,
                "lora_a_auroc": f"{s.mean:.3f} ± {s.std:.3f}",
                "mean": s.mean,
                "std": s.std,
                "ci95_low": s.ci_low,
                "ci95_high": s.ci_high,
                "component_mean": s.component_mean,
                "sites": len(s.scores),
                "tokens": s.n_tokens,
                "ood_factuality": float((ood_scores or {}).get(name, float("nan"))),
            }
        )
    return pd.DataFrame(rows)


def format_heatmap(df, digits: int = 2) -> str:
    """A fixed-width text table of a layer × module heatmap ('  -  ' where there is no site)."""
    cols = [c.replace("_proj", "") for c in df.columns]
    w = digits + 3
    lines = ["layer " + " ".join(f"{c:>{w}s}" for c in cols)]
    for layer, row in df.iterrows():
        cells = ["-".rjust(w) if math.isnan(v) else f"{v:{w}.{digits}f}" for v in row.to_numpy(dtype=float)]
        lines.append(f"{layer:>5d} " + " ".join(cells))
    return "\n".join(lines)


__all__ = [
    "METHOD",
    "rank_auroc",
    "fit_logistic",
    "best_component",
    "cv_splits",
    "cv_logistic_auroc",
    "site_scores",
    "bootstrap_mean_ci",
    "SiteScore",
    "Separability",
    "separability",
    "comparison_table",
    "format_heatmap",
]
