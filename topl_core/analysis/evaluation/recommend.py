"""Settings recommended for one adapter from its own dev documents, each with its evidence, computed once and cached
with the adapter's analysis (`python -m topl_core recommend --run RUN`):

    τ        the gated mode's threshold: the p(good) quantile that flags `flag_share` of the merged model's own tokens
             on the dev documents (the demo head flags 0.3% of them at 0.5, so a fixed τ leaves the gate idle)
    λ        of the always-on vector and of the gated mode at that τ: gated_comparison.choose on the same dev documents
             (by mean factuality, a degenerate text scored 0)
    sites, layer m   not searched here: the defaults, said "untested", with what would test them
    held out (heldout=True)   gated_comparison.compare at those settings on the test documents, once; every call that
             asks for it appends a line to cache/analysis/recommend/heldout_log.jsonl, also from the cache

The dev documents are gated_comparison's: the adapter's val split (as it was trained) and CLIFF's val cut. An adapter
without a head has no gate to set: its τ and gated λ are said not applicable, and its always-on λ is searched as any
adapter's (held out: against the merged model alone).

    RecommendSettings(n_split=8, n_cliff=8, flag_share=0.1, lambdas=(1.0, 2.0), keep=0, heldout=False)
    recommend(run, settings, cfg=EvalConfig(), progress=None, use_cache=True) -> Recommendation
    opening(run, mode) -> ModeDefaults            what steering in `mode` opens at: recommended(run).for_mode, or
        None for τ and λ with the reason
    recommended(run) -> Recommendation | None    the one computed last for this adapter (any settings or precision;
        the local cache, then the one shipped with the demo adapters), never computed here: what `steer` and the
        Steering, Talk and Evaluation pages open at
    Recommendation.values (name → value), .line() ("τ = 0.91, λ = 1 … recommended from 16 dev documents"), .rows(),
        .for_mode(mode) → ModeDefaults (the τ and λ a steering mode opens at, and where they came from)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Sequence

import numpy as np

from ...data.records import Record
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError
from ...training.adapters import open_adapter
from ..cache import JSON, analysis_cache_dir, cached, stored
from .config import EvalConfig, ProgressFn, Variant
from .evaluate import generate_for
from .gated_comparison import GatedStudy, Scoring, choose, compare, paired_table

UNTESTED = "untested"
LATEST = {"analysis": "recommended"}  # the key of the recommendation computed last for an adapter
RECOMMEND_COMMAND = "python -m topl_core recommend --run"


@dataclass(frozen=True)
class RecommendSettings:
    n_split: int = config_field(8, label="Dev documents (split)", help="documents of the adapter's val split", min=0)
    n_cliff: int = config_field(8, label="Dev documents (CLIFF)", help="documents of CLIFF's val cut", min=0)
    flag_share: float = config_field(
        0.1,
        label="Share flagged",
        help="τ flags this share of the merged model's own tokens on the dev documents",
        min=0.001,
        max=0.999,
    )
    lambdas: tuple[float, ...] = config_field(
        (1.0, 2.0), label="λ values", help="λ searched on the dev documents (normalised units)"
    )
    keep: int = config_field(0, label="k", help="the gate's k: steered tokens after each one taken back", min=0)
    heldout: bool = config_field(
        False, label="Held out", help="also measure the chosen settings once on the test documents (logged)"
    )

    def __post_init__(self) -> None:
        if self.n_split + self.n_cliff < 1:
            raise ConfigError("n_split + n_cliff must be at least 1: the recommendation needs dev documents.")
        if not 0 < self.flag_share < 1:
            raise ConfigError(f"flag_share={self.flag_share!r}: give a share in (0, 1), e.g. 0.1.")
        if not self.lambdas:
            raise ConfigError("lambdas: give at least one λ to search.")
        object.__setattr__(self, "lambdas", tuple(float(x) for x in self.lambdas))


@dataclass(frozen=True)
class Recommended:
    """One setting: its value (None: no recommendation), where it came from and the figures behind it."""

    name: str
    value: float | int | None
    source: str
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModeDefaults:
    """What a steering mode opens at for one adapter: τ (gated) and λ (normalised units) when recommended — None
    where nothing is — and the one line saying where they came from."""

    tau: float | None
    lam: float | None
    source: str

    def bound(self, choices: Sequence[float], default: float) -> float:
        """The slider's ± bound: `default`, widened to the smallest of `choices` beyond the recommended λ (room to
        move past it both ways)."""
        if self.lam is None or abs(self.lam) < default:
            return default
        return min((c for c in choices if c > abs(self.lam)), default=max(choices))

    def position(self, grid: Sequence[float], neutral: float) -> float:
        """The slider position (of `grid`) nearest the recommended λ when the grid's range holds it, else `neutral`."""
        if self.lam is None or not min(grid) <= self.lam <= max(grid):
            return neutral
        return min(grid, key=lambda x: abs(x - self.lam))


@dataclass(frozen=True)
class Recommendation:
    run: str
    documents: int  # dev documents
    settings: tuple[Recommended, ...]
    heldout: dict | None = None  # the chosen settings on the test documents (paired table rows), when measured

    @property
    def values(self) -> dict:
        return {s.name: s.value for s in self.settings}

    def line(self) -> str:
        """The one line a command prints: the values and where they come from."""
        v = self.values
        if v.get("always_on_lambda") is None:
            return f"nothing to set: {self.settings[0].source}"
        if v.get("tau") is None:
            return (
                f"λ = {v['always_on_lambda']:g} (always-on; no gate to set: {self.settings[0].source}), "
                f"recommended from {self.documents} dev documents"
            )
        return (
            f"τ = {v['tau']:.2f}, λ = {v['gated_lambda']:g} (gated; always-on λ = {v['always_on_lambda']:g}), "
            f"recommended from {self.documents} dev documents"
        )

    def for_mode(self, mode: str) -> ModeDefaults:
        """The gated mode's τ and λ, the always-on λ for the paper's vector mode (the one the dev search steered);
        no other mode's λ was searched."""
        v = self.values
        lam = {"gated": v.get("gated_lambda"), "vector": v.get("always_on_lambda")}.get(mode)
        tau = v.get("tau") if mode == "gated" else None
        said = [f"τ = {tau:.2f}"] if tau is not None else []
        said += [f"λ = {lam:g}"] if lam is not None else []
        if not said:
            return ModeDefaults(None, None, "")
        return ModeDefaults(tau, lam, f"{', '.join(said)}: recommended from {self.documents} dev documents")

    def rows(self) -> list[dict]:
        return [{"setting": s.name, "value": s.value, "source": s.source, **s.evidence} for s in self.settings]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Recommendation":
        return cls(d["run"], d["documents"], tuple(Recommended(**s) for s in d["settings"]), d.get("heldout"))


def tau_for_share(p_good: np.ndarray, share: float) -> float:
    """The smallest τ on a 0.01 grid at which p(good) < τ flags at least `share` of the tokens (at most 1)."""
    p = np.asarray(p_good, dtype=np.float64)
    if not len(p):
        return math.nan
    step = lambda x: round(x, 2)  # noqa: E731 (the grid)
    tau = step(math.floor(float(np.quantile(p, share)) * 100) / 100)
    while tau < 1.0 and (p < tau).mean() < share:
        tau = step(tau + 0.01)
    while tau > 0.0 and (p < step(tau - 0.01)).mean() >= share:
        tau = step(tau - 0.01)
    return tau


def recommend(
    run,
    settings: RecommendSettings = RecommendSettings(),
    cfg: EvalConfig = EvalConfig(),
    progress: ProgressFn | None = None,
    use_cache: bool = True,
) -> Recommendation:
    """The recommendation for adapter `run` (module docstring), cached by its fingerprint, the settings and the
    generation settings; a held-out measurement asked for is logged on every call."""
    adapter = open_adapter(run)
    key = {
        "analysis": "recommend",
        **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()},
        "generation": {k: getattr(cfg, k) for k in ("max_new_tokens", "max_doc_tokens", "precision", "device")},
        "scorer": cfg.scorer,
        "top_k": cfg.top_k,
        "cliff_csv": cfg.cliff_csv,
    }
    if not adapter.has_head:  # its always-on λ is searched now: what was cached before, without one, is not read
        key["always_on_without_head"] = True
    # the same settings measured held out too answer a call that does not ask for the held-out figure
    data = stored("recommend", {**key, "heldout": True}, JSON, adapter=adapter) if use_cache else None
    if data is None or settings.heldout:
        compute = lambda: _compute(str(adapter.path), settings, cfg, progress, use_cache).to_json()  # noqa: E731
        data = cached("recommend", key, compute, JSON, adapter=adapter, enabled=use_cache)
    rec = Recommendation.from_json(data)
    cached("recommend", LATEST, lambda: data, JSON, adapter=adapter, refresh=True)  # what recommended() reads
    if settings.heldout and rec.heldout is not None:
        _log_heldout(adapter, rec, settings)
    return rec


def recommended(run) -> Recommendation | None:
    """The recommendation computed last for adapter `run` (local cache, then the shipped one); None when `recommend`
    has not run for it. Never computes: a page or a command opens at it, or at the defaults with a hint."""
    data = stored("recommend", LATEST, JSON, adapter=run)
    return None if data is None else Recommendation.from_json(data)


def opening(run, mode: str) -> ModeDefaults:
    """What steering adapter `run` in `mode` opens at: the recommended τ and λ where its recommendation covers the
    mode, else None for both with the line saying why (and how to compute one)."""
    rec = recommended(run)
    if rec is None:
        path = open_adapter(run).path
        return ModeDefaults(
            None, None, f"defaults: no recommendation for this adapter yet (`{RECOMMEND_COMMAND} {path}`)"
        )
    opens = rec.for_mode(mode)
    return (
        opens if opens.source else ModeDefaults(None, None, f"defaults: the recommendation sets nothing in {mode} mode")
    )


def _compute(run: str, s: RecommendSettings, cfg: EvalConfig, progress, use_cache: bool) -> Recommendation:
    adapter = open_adapter(run)
    study = GatedStudy(run, s.lambdas, (), (s.keep,), s.n_split, s.n_cliff)  # the gate's τ added below, with a head
    scoring = Scoring(study, cfg, use_cache)
    docs = study.documents(cfg, "val")
    no_gate = f"{adapter.name} has no head (method {adapter.method or 'unknown'}): the gated mode needs one"
    if adapter.has_head:
        tau = _tau(run, s, cfg, progress, use_cache, scoring, docs)
        if tau.value is None:
            return Recommendation(run, len(docs), _untested(adapter, cfg, tau.source))
        study = replace(study, taus=(tau.value,))
    else:
        tau = Recommended("tau", None, no_gate)
    choice = choose(study, cfg, progress, scoring)
    dev = choice.dev
    cols = ["lambda", "score", "factuality", "degenerate", "n"]
    grid = ", ".join(f"{x:g}" for x in s.lambdas)
    source = f"the best dev score (mean factuality, a degenerate text 0) of λ ∈ {{{grid}}} on {len(docs)} dev documents"
    if study.gates:
        gated = dev[dev["variant"] == "gated"][cols].to_dict("records")
        gate = (
            Recommended(
                "gated_lambda", choice.gated_lambda, source + f" at τ = {tau.value:.2f}, k = {s.keep}", {"dev": gated}
            ),
            Recommended("keep", s.keep, f"{UNTESTED}: the value given (no k searched)"),
        )
    else:
        gate = (Recommended("gated_lambda", None, no_gate), Recommended("keep", None, no_gate))
    on = dev[dev["variant"] == "always-on"][cols].to_dict("records")
    recs = (tau, gate[0], Recommended("always_on_lambda", choice.always_on_lambda, source, {"dev": on}), gate[1])
    recs += _untested(adapter, cfg, "")[2:]
    heldout = None
    if s.heldout:
        rows = compare(study, cfg, choice, progress, scoring)
        table = paired_table(rows)
        heldout = {"documents": int(rows["doc_id"].nunique()), "table": table.to_dict("records")}
    return Recommendation(run, len(docs), recs, heldout)


def _tau(run: str, s: RecommendSettings, cfg: EvalConfig, progress, use_cache: bool, scoring, docs) -> Recommended:
    """The gate's τ: the p(good) quantile that flags `s.flag_share` of the merged model's own tokens on the dev
    documents (None, with the reason, when it wrote nothing)."""
    if progress:
        progress(f"the merged model's own summaries of {len(docs)} dev documents")
    texts = generate_for(Variant.merged(run), docs, cfg, scoring.models, scoring.vectors, use_cache)
    said = [(d, t) for d, t in zip(docs, texts) if t.strip()]
    scores = scoring.head.score([Record(d.doc_id, d.document, t, token_labels_known=False) for d, t in said])
    p = np.concatenate([x.p_good for x in scores]) if scores else np.zeros(0)
    if not len(p):
        return Recommended("tau", None, "the merged model wrote nothing on the dev documents")
    tau = tau_for_share(p, s.flag_share)
    by_set: dict[str, list[np.ndarray]] = {}
    for (d, _), x in zip(said, scores):
        by_set.setdefault(d.set, []).append(x.p_good)
    evidence = {
        "documents": len(docs),
        "summaries": len(said),
        "tokens": int(len(p)),
        "target_share": s.flag_share,
        "flagged_at_tau": float((p < tau).mean()),
        "flagged_at_0.5": float((p < 0.5).mean()),
        # how τ behaves on each kind of dev text: the adapter's own data (ID) against CLIFF's articles (OOD)
        "flagged_at_tau_by_set": {k: float((np.concatenate(v) < tau).mean()) for k, v in sorted(by_set.items())},
        "p_good_quantiles": {f"{q:g}": float(np.quantile(p, q)) for q in (0.01, 0.05, 0.1, 0.25, 0.5)},
    }
    return Recommended(
        "tau",
        tau,
        f"flags {100 * s.flag_share:g}% of the merged model's own tokens on {len(docs)} dev documents",
        evidence,
    )


def _untested(adapter, cfg: EvalConfig, why: str) -> tuple[Recommended, ...]:
    """The settings no study here searched: their defaults, said untested (with `why` for τ and λ when given)."""
    layer = adapter.head_layer if adapter.has_head else None
    return (
        Recommended("tau", None, why or UNTESTED),
        Recommended("gated_lambda", None, why or UNTESTED),
        Recommended(
            "sites", cfg.top_k, f"{UNTESTED}: the default top {cfg.top_k} by LoRA-A AUROC (no study here varies it)"
        ),
        Recommended(
            "layer",
            None if layer is None else int(layer),
            f"{UNTESTED}: the layer the adapter was trained with; a layer sweep of this model and data "
            "(python -m topl_core sweep) measures which windows help",
        ),
    )


def heldout_log_path():
    return analysis_cache_dir() / "recommend" / "heldout_log.jsonl"


def _log_heldout(adapter, rec: Recommendation, settings: RecommendSettings) -> None:
    row = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "adapter": adapter.name,
        "fingerprint": adapter.fingerprint(),
        "values": rec.values,
        "documents": (rec.heldout or {}).get("documents"),
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings).items()},
    }
    path = heldout_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
