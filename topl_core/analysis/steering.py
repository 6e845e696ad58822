"""LoRA-B steering (docs/design.md §2): v = scaling · B (μ+ − μ−) at the top-k residual-writing sites, added as λ·v to
those sites' outputs while the merged model generates.

    compute_steering_vectors(weights, proj, aurocs, top_k=4, modules=("o_proj", "down_proj"), lambda_range=(-4, 4),
                             **meta) -> SteeringVectors
        weights: {Site: LoraWeights} (lora_weights(peft_model, site, adapter) or read_lora_weights(run));
        proj: Projections of the same adapter's A·x with token labels; aurocs: Separability or {site key: AUROC}.
        μ+ / μ− = mean A-projection (r-dim) of good / bad tokens; sites ranked by AUROC (NaN last), top_k kept.
    steering_vectors_from_model(peft_model, proj, aurocs, top_k=4, adapter=None, ...) -> SteeringVectors
        the same with A/B/scaling read from PEFT (lora_A[adapter], lora_B[adapter], scaling[adapter]).
    build_steering_vectors(run, records, settings=ProbeSettings(), top_k=4, base=None, use_cache=True,
                           lambda_range=(-4, 4)) -> SteeringVectors      projections cached, AUROC from cv_auroc
    SteeringVectors.save(directory) / SteeringVectors.load(directory)
        steering_vectors.safetensors (vector/<key>, mu_good/<key>, mu_bad/<key>) + steering.json (base model, base
        and adapter fingerprints, sites with AUROC and ‖v‖, λ range, formula).

    with steer(model, vectors, lam): ...
        forward hooks on the modules at the vectors' site paths (merged model, or the PEFT model) add lam·v to
        their outputs at every position, in every forward made *from the thread that entered the context* (other
        threads using the same model are untouched). The model is never modified; hooks are registered inside
        try and removed in finally. λ = 0 reproduces the unsteered output exactly. Works with KV-cache generation
        (each cached step's new positions are steered just as a full recompute would steer them). Any generation
        code runs steered inside the context, e.g. `with steer(lm.model, v, 2.0): generate(lm, documents, cfg)`.

    SteeringSession(lm, vectors)            lm: a LoadedModel holding the MERGED model (load_merged(spec, run))
        .generate_steered(document, lam, gen_cfg=GenerationConfig(), task="summarization") -> str
        .generate_many(documents, lam, gen_cfg=GenerationConfig()) -> list[str]     batched (topl_core.generate)
        .generate_grid(document, lambdas, gen_cfg=GenerationConfig()) -> list[{"lambda", "text"}]
        SteeringSession.from_run(run, vectors, spec=None)
      Generation holds a per-model lock (sessions sharing one model take turns; sessions on different models run
      in parallel); it never mutates the model, the tokenizer or the vectors.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch

from ..adapters import open_adapter
from ..architecture import base_causal_lm
from ..data.records import records_fingerprint
from ..errors import ModelError
from ..generate import GenerationConfig, generate, load_merged
from ..io import save_tensors, write_json
from ..models import LoadedModel, ModelSpec
from ..precision import to_numpy
from .cache import cached, json_codec
from .capture import DEFAULT_SET, Projections, collect_projections
from .control_vector import control_vector_layers, model_hint_for, write_control_vector
from .probe import ProbeSettings, run_projections
from .separability import separability
from .sites import (
    RESIDUAL_MODULES,
    LoraWeights,
    Site,
    active_adapter_name,
    lora_sites,
    lora_weights,
    read_lora_weights,
    site_module,
    sort_sites,
)

FORMULA = "v = scaling * B @ (mu_good - mu_bad); output += lambda * v"
MODES: tuple[str, ...] = ("vector", "conditional", "diff-mean", "random")
CONSTANT_MODES: tuple[str, ...] = ("vector", "diff-mean", "random")  # a fixed vector per site, added at every position
POSITIONS: tuple[str, ...] = ("all", "generated")
UNITS: tuple[str, ...] = ("normalised", "raw")
# Normalised λ: |λ| = 1 adds, at each steered site, a vector whose norm is UNIT_FRACTION × that site's mean output
# norm on the token set (the same norm for every constant mode: only the direction differs between them).
UNIT_FRACTION = 0.1
UNITS_DOC = (
    f"normalised: lambda = 1 adds {UNIT_FRACTION:g} x the site's mean output norm (output_norm) along the mode's "
    "direction; raw: lambda multiplies the stored vector (the paper's formula)"
)
RANDOM_SEED = 0  # the random control's directions are seeded per site from this and the site key


@dataclass(frozen=True)
class SteerConfig:
    """How λ is applied. mode: "vector" (λ·v, the paper's LoRA-B formula), "conditional" (the adapter's own update
    scaled by λ: 0 = base, 1 = merged), "diff-mean" (mean good − bad output at the site), "random" (a seeded random
    direction with ‖v‖); positions: "all" or "generated" (the prompt is left untouched); units (constant modes):
    "normalised" (module docstring) or "raw"."""

    mode: str = "vector"
    positions: str = "all"
    units: str = "normalised"

    def __post_init__(self) -> None:
        for name, value, choices in (
            ("mode", self.mode, MODES),
            ("positions", self.positions, POSITIONS),
            ("units", self.units, UNITS),
        ):
            if value not in choices:
                raise ValueError(f"SteerConfig.{name}={value!r}: choose one of {choices}.")

    @property
    def neutral(self) -> float:
        """The λ that leaves the merged model unchanged."""
        return 1.0 if self.mode == "conditional" else 0.0

    def label(self) -> str:
        unit = "" if self.mode == "conditional" else f", {self.units}"
        return f"{self.mode} ({self.positions} positions{unit})"


VECTORS_FILE = "steering_vectors.safetensors"
META_FILE = "steering.json"


@dataclass(frozen=True)
class SteeringVectors:
    """Steering vectors of one adapter. Arrays are float32; vectors[k] is (d_out,), mu_*[k] is (r,)."""

    sites: tuple[Site, ...]
    vectors: dict[str, np.ndarray]
    mu_good: dict[str, np.ndarray]
    mu_bad: dict[str, np.ndarray]
    auroc: dict[str, float]
    scaling: dict[str, float]
    base_model: str | None = None
    base_fingerprint: str | None = None
    adapter_fingerprint: str | None = None
    adapter_path: str | None = None
    lambda_range: tuple[float, float] = (-4.0, 4.0)
    n_good: int = 0
    n_bad: int = 0
    extra: dict = field(default_factory=dict)
    # the merged model's site outputs on the same token set: mean good − mean bad output (the diff-mean control)
    # and the mean output norm (the unit of normalised λ); empty for vectors exported before they existed
    diff_mean: dict[str, np.ndarray] = field(default_factory=dict)
    output_norm: dict[str, float] = field(default_factory=dict)

    def norms(self) -> dict[str, float]:
        return {k: float(np.linalg.norm(v)) for k, v in self.vectors.items()}

    def raw(self, mode: str) -> dict[str, np.ndarray]:
        """The per-site vector of a constant mode at raw λ = 1: LoRA-B's v ("vector"), the output diff-mean
        ("diff-mean"), or a seeded random direction with ‖v‖ at each site ("random")."""
        if mode == "vector":
            return self.vectors
        if mode == "diff-mean":
            self._need_outputs()
            return self.diff_mean
        if mode == "random":
            out = {}
            for s in self.sites:
                seed = int.from_bytes(hashlib.sha256(f"{RANDOM_SEED}|{s.key}".encode()).digest()[:4], "little")
                r = np.random.default_rng(seed).standard_normal(self.vectors[s.key].shape)
                out[s.key] = (r * (np.linalg.norm(self.vectors[s.key]) / np.linalg.norm(r))).astype(np.float32)
            return out
        raise ValueError(f"mode={mode!r}: constant vectors exist for {CONSTANT_MODES}.")

    def unit_factor(self, mode: str) -> dict[str, float]:
        """Per site, the raw λ that normalised λ = 1 stands for: UNIT_FRACTION · (mean output norm) / ‖raw vector‖."""
        return self._unit_factor(self.raw(mode))

    def _unit_factor(self, raw: Mapping[str, np.ndarray]) -> dict[str, float]:
        self._need_outputs()
        return {
            k: float(UNIT_FRACTION * self.output_norm[k] / max(float(np.linalg.norm(v)), 1e-30)) for k, v in raw.items()
        }

    def deltas(self, mode: str, units: str = "normalised") -> dict[str, np.ndarray]:
        """Per site, what λ = 1 adds to the site's output in this mode and unit (float32)."""
        raw = self.raw(mode)  # computed once (the random control draws its directions here)
        if units == "raw":
            return {k: np.asarray(v, np.float32) for k, v in raw.items()}
        factor = self._unit_factor(raw)
        return {k: (np.asarray(v, np.float64) * factor[k]).astype(np.float32) for k, v in raw.items()}

    def adapter_lora(self) -> dict[Site, LoraWeights]:
        """Every LoRA pair of the adapter these vectors came from (what the conditional mode scales)."""
        if not self.adapter_path:
            raise ModelError(
                "these steering vectors name no adapter folder: conditional steering cannot read its A and B "
                "(pass lora= to steer, or recompute the vectors from the adapter)."
            )
        return read_lora_weights(self.adapter_path)

    def save_control_vector(
        self,
        path: str | Path,
        mode: str = "vector",
        units: str = "normalised",
        model_type: str = "llama",
        layer_count: int | None = None,
    ) -> list[str]:
        """The mode's λ = 1 vectors as a llama.cpp control vector (GGUF; topl_core.analysis.control_vector):
        `llama-cli --control-vector-scaled FILE λ` then steers like λ here (approximately: an o_proj vector is added
        at the end of its layer). model_type / layer_count: the base model's config.model_type / num_hidden_layers.
        Returns the sites left out: those of layer 0, which llama.cpp cannot carry (it rejects direction.0)."""
        if mode not in ("vector", "diff-mean"):
            raise ValueError(
                f"mode={mode!r}: a control vector holds a fixed direction — export 'vector' or 'diff-mean'."
            )
        deltas = self.deltas(mode, units)
        kept = [s for s in self.sites if s.layer >= 1]
        if not kept:
            raise ModelError("every steered site is in layer 0, which a llama.cpp control vector cannot carry.")
        layers = control_vector_layers({s: deltas[s.key] for s in kept}, layer_count)
        write_control_vector(path, layers, model_hint_for(model_type), layer_count)
        return [s.key for s in self.sites if s.layer < 1]

    def _need_outputs(self) -> None:
        if not self.output_norm or not self.diff_mean:
            raise ModelError(
                "these steering vectors carry no site-output statistics (exported by an older version): normalised "
                "λ and the diff-mean control need them — recompute the vectors (python -m topl_core steer --export)."
            )

    def metadata(self) -> dict:
        norms = self.norms()
        return {
            "formula": FORMULA,
            "base_model": self.base_model,
            "base_fingerprint": self.base_fingerprint,
            "adapter_fingerprint": self.adapter_fingerprint,
            "adapter_path": self.adapter_path,
            "lambda_range": list(self.lambda_range),
            "units": UNITS_DOC,
            "n_good": self.n_good,
            "n_bad": self.n_bad,
            "sites": [
                {
                    **s.to_json(),
                    "key": s.key,
                    "auroc": self.auroc[s.key],
                    "scaling": self.scaling[s.key],
                    "norm": norms[s.key],
                    **({"output_norm": self.output_norm[s.key]} if s.key in self.output_norm else {}),
                }
                for s in self.sites
            ],
            "extra": self.extra,
        }

    def save(self, directory: str | Path) -> Path:
        """Write steering_vectors.safetensors + steering.json (atomically) into `directory`."""
        d = Path(directory)
        tensors = {}
        for s in self.sites:
            tensors[f"vector/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.vectors[s.key], np.float32))
            tensors[f"mu_good/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.mu_good[s.key], np.float32))
            tensors[f"mu_bad/{s.key}"] = torch.from_numpy(np.ascontiguousarray(self.mu_bad[s.key], np.float32))
            if s.key in self.diff_mean:
                tensors[f"diff_mean/{s.key}"] = torch.from_numpy(
                    np.ascontiguousarray(self.diff_mean[s.key], np.float32)
                )
        meta = self.metadata()
        save_tensors(d / VECTORS_FILE, tensors, {"topl_steering": json.dumps(meta)})
        write_json(d / META_FILE, meta)
        return d

    @classmethod
    def load(cls, directory: str | Path) -> "SteeringVectors":
        from safetensors.torch import load_file

        d = Path(directory)
        if not (d / VECTORS_FILE).exists() or not (d / META_FILE).exists():
            raise ModelError(
                f"{d}: no {VECTORS_FILE} + {META_FILE}; export vectors with `python -m topl_core steer --export {d}`."
            )
        meta = json.loads((d / META_FILE).read_text())
        t = load_file(d / VECTORS_FILE)
        sites = tuple(Site.from_json(s) for s in meta["sites"])
        try:
            get = lambda prefix: {s.key: t[f"{prefix}/{s.key}"].float().numpy() for s in sites}  # noqa: E731
            diff_mean = get("diff_mean") if any(k.startswith("diff_mean/") for k in t) else {}
            return cls._from_parts(meta, get("vector"), get("mu_good"), get("mu_bad"), diff_mean)
        except KeyError as e:
            raise ModelError(
                f"{d / VECTORS_FILE}: missing tensor {e}; the export is incomplete — export it again."
            ) from e

    def to_json(self) -> dict:
        """Metadata and arrays as JSON (the analysis cache; float32 values round-trip exactly through JSON)."""
        arrays = lambda d: {k: np.asarray(v, np.float32).tolist() for k, v in d.items()}  # noqa: E731
        return {
            **self.metadata(),
            "vectors": arrays(self.vectors),
            "mu_good": arrays(self.mu_good),
            "mu_bad": arrays(self.mu_bad),
            "diff_mean": arrays(self.diff_mean),
        }

    @classmethod
    def from_json(cls, d: dict) -> "SteeringVectors":
        arrays = lambda m: {k: np.asarray(v, np.float32) for k, v in m.items()}  # noqa: E731
        return cls._from_parts(
            d, arrays(d["vectors"]), arrays(d["mu_good"]), arrays(d["mu_bad"]), arrays(d.get("diff_mean", {}))
        )

    @classmethod
    def _from_parts(cls, meta: dict, vectors: dict, mu_good: dict, mu_bad: dict, diff_mean: dict) -> "SteeringVectors":
        return cls(
            sites=tuple(Site.from_json(s) for s in meta["sites"]),
            vectors=vectors,
            mu_good=mu_good,
            mu_bad=mu_bad,
            auroc={s["key"]: float(s["auroc"]) for s in meta["sites"]},
            scaling={s["key"]: float(s["scaling"]) for s in meta["sites"]},
            base_model=meta.get("base_model"),
            base_fingerprint=meta.get("base_fingerprint"),
            adapter_fingerprint=meta.get("adapter_fingerprint"),
            adapter_path=meta.get("adapter_path"),
            lambda_range=tuple(meta.get("lambda_range", (-4.0, 4.0))),
            n_good=int(meta.get("n_good", 0)),
            n_bad=int(meta.get("n_bad", 0)),
            extra=meta.get("extra", {}),
            diff_mean=diff_mean,
            output_norm={s["key"]: float(s["output_norm"]) for s in meta["sites"] if "output_norm" in s},
        )


def _aurocs(aurocs) -> dict[str, float]:
    if hasattr(aurocs, "scores"):  # a Separability
        return {s.site.key: float(s.cv_auroc) for s in aurocs.scores}
    return {str(k.key if isinstance(k, Site) else k): float(v) for k, v in aurocs.items()}


def rank_sites(
    sites: Sequence[Site], aurocs: Mapping[str, float], top_k: int, modules: Sequence[str] = RESIDUAL_MODULES
) -> list[Site]:
    """The top_k sites among `modules` by AUROC (descending; NaN last; ties by layer then module order)."""
    cand = [s for s in sort_sites(sites) if s.module in modules and s.key in aurocs]
    cand.sort(key=lambda s: -aurocs[s.key] if not math.isnan(aurocs[s.key]) else math.inf)
    return cand[:top_k]


def compute_steering_vectors(
    weights: Mapping[Site, LoraWeights],
    proj: Projections,
    aurocs,
    top_k: int = 4,
    modules: Sequence[str] = RESIDUAL_MODULES,
    lambda_range: tuple[float, float] = (-4.0, 4.0),
    outputs: Projections | None = None,
    **meta,
) -> SteeringVectors:
    """v = scaling · B (μ+ − μ−) for the top_k sites (see the module docstring). `outputs`: the merged model's
    outputs at (at least) the chosen sites on the same labelled tokens (site_outputs): with them the vectors carry
    the diff-mean control and the mean output norm that normalised λ needs."""
    bad_modules = [m for m in modules if m not in RESIDUAL_MODULES]
    if bad_modules:
        raise ValueError(
            f"modules={bad_modules}: only {RESIDUAL_MODULES} write to the residual stream and can be steered there."
        )
    if top_k < 1:
        raise ValueError(f"top_k={top_k}: steer at least one site.")
    scores = _aurocs(aurocs)
    p = proj.labelled()
    good, bad = p.labels == 1, p.labels == 0
    if not good.any() or not bad.any():
        raise ValueError(
            f"steering needs good and bad tokens; the token set has {int(good.sum())} good, {int(bad.sum())} bad."
        )
    chosen = rank_sites([s for s in p.sites if s in weights], scores, top_k, modules)
    if not chosen:
        raise ValueError(f"no {'/'.join(modules)} site with an AUROC among the projections' sites: nothing to steer.")
    vectors, mu_g, mu_b, scaling = {}, {}, {}, {}
    for s in chosen:
        w = weights[s]
        X = torch.from_numpy(p[s]).double()
        g, b = X[torch.from_numpy(good)].mean(0), X[torch.from_numpy(bad)].mean(0)
        v = w.scaling * (w.B.double() @ (g - b))
        vectors[s.key] = v.float().numpy()
        mu_g[s.key], mu_b[s.key] = g.float().numpy(), b.float().numpy()
        scaling[s.key] = float(w.scaling)
    diff_mean, output_norm = {}, {}
    if outputs is not None:
        o = outputs.labelled()
        if not np.array_equal(o.labels, p.labels):
            raise ValueError("outputs: the site outputs were captured on other tokens than the projections.")
        for s in chosen:
            Y = o[s].astype(np.float64)
            diff_mean[s.key] = (Y[good].mean(0) - Y[bad].mean(0)).astype(np.float32)
            output_norm[s.key] = float(np.linalg.norm(Y, axis=1).mean())
    return SteeringVectors(
        tuple(chosen),
        vectors,
        mu_g,
        mu_b,
        {s.key: scores[s.key] for s in chosen},
        scaling,
        lambda_range=tuple(float(x) for x in lambda_range),
        n_good=int(good.sum()),
        n_bad=int(bad.sum()),
        diff_mean=diff_mean,
        output_norm=output_norm,
        **meta,
    )


def site_outputs(
    lm: LoadedModel, records, sites: Sequence[Site], settings: ProbeSettings, progress=None
) -> Projections:
    """The merged model's outputs at residual-writing `sites` (o_proj / down_proj: Linear layers) on the labelled
    tokens of `records`, captured as "projections" onto the merged weight W (x·Wᵀ + bias = the module's output),
    with the same encoding and token selection as the LoRA-A projections."""
    weights, bias = {}, {}
    for s in sites:
        m = site_module(lm.model, s)
        if hasattr(m, "base_layer") or not isinstance(m, torch.nn.Linear):
            raise ModelError(
                f"{s.key}: site outputs are read from a merged model's Linear layer, not {type(m).__name__}."
            )
        weights[s] = m.weight.detach()
        if m.bias is not None:
            bias[s.key] = to_numpy(m.bias)
    out = collect_projections(
        lm.model,
        lm.tokenizer,
        records,
        "labelled",
        settings.batch_size,
        settings.max_doc_tokens,
        settings.max_response_tokens,
        settings.precision,
        sites=sites,
        weights=weights,
        progress=progress,
    )
    for k, b in bias.items():
        out.values[k] = out.values[k] + b
    return out


def steering_vectors_from_model(
    model: torch.nn.Module, proj: Projections, aurocs, top_k: int = 4, adapter: str | None = None, **kw
) -> SteeringVectors:
    """compute_steering_vectors with A/B/scaling read from the PEFT model for `adapter` (default: active)."""
    adapter = adapter or active_adapter_name(model)
    weights = {s: lora_weights(model, s, adapter) for s in lora_sites(model) if s in set(proj.sites)}
    return compute_steering_vectors(weights, proj, aurocs, top_k, **kw)


def build_steering_vectors(
    adapter,
    records,
    settings=None,
    top_k: int = 4,
    base: LoadedModel | None = None,
    use_cache: bool = True,
    lambda_range: tuple[float, float] = (-4.0, 4.0),
    progress=None,
    merged: LoadedModel | None = None,
) -> SteeringVectors:
    """Steering vectors of an adapter (a run, a PEFT folder, a hub id) from a labelled token set: projections
    (cached), per-site cv AUROC of the residual-writing sites, A/B/scaling from the adapter's files, and the merged
    model's outputs at the chosen sites (`merged`, loaded when not given) for the diff-mean control and λ's unit."""
    adapter = open_adapter(adapter)
    settings = (settings or ProbeSettings()).resolved(adapter)

    def compute() -> SteeringVectors:
        proj = run_projections(adapter, records, settings, base, use_cache, progress)[DEFAULT_SET]
        residual = [s for s in proj.sites if s.residual]
        sub = Projections(
            tuple(residual),
            {s.key: proj[s] for s in residual},
            proj.labels,
            proj.record_ids,
            proj.positions,
            proj.tokens,
            proj.doc_ids,
        )
        sep = separability(sub, adapter.name, settings.folds, settings.seed, n_boot=10)
        weights = read_lora_weights(adapter.path)
        chosen = rank_sites([s for s in residual if s in weights], _aurocs(sep), top_k)
        lm = merged or load_merged(ModelSpec(adapter.base_model, "float32", adapter.device), adapter)
        outputs = site_outputs(lm, records, chosen, settings) if chosen else None
        return compute_steering_vectors(
            weights,
            proj,
            sep,
            top_k,
            lambda_range=lambda_range,
            outputs=outputs,
            base_model=adapter.base_model,
            base_fingerprint=adapter.base_fingerprint,
            adapter_fingerprint=adapter.fingerprint(),
            adapter_path=str(adapter.path),
            extra={"auroc_column": "cv_auroc", "tokens": "labelled", "created": time.time()},
        )

    key = {
        "analysis": "steering_vectors",
        "version": 2,  # 2: with the merged model's site outputs (diff-mean control, normalised λ)
        "settings": asdict(settings),
        "records": records_fingerprint(records),
        "top_k": top_k,
        "lambda_range": [float(x) for x in lambda_range],
    }
    vectors = cached(
        "steering_vectors",
        key,
        compute,
        json_codec(SteeringVectors.to_json, SteeringVectors.from_json),
        adapter=adapter,
        enabled=use_cache,
    )
    return replace(vectors, adapter_path=str(adapter.path))  # a cached entry may come from another checkout


# --- applying vectors --------------------------------------------------------------------------------------

_HOOK_LOCK = threading.Lock()  # registering/removing hooks is serialised (hook dicts are shared by threads)


def _is_prefill(kwargs: dict) -> bool:
    """Whether a causal-LM forward processes the prompt: no KV cache yet (a plain forward, or generate's first step).
    Later generate steps carry a cache holding the tokens before them."""
    past = kwargs.get("past_key_values")
    return past is None or past.get_seq_length() == 0


@contextmanager
def steer(
    model: torch.nn.Module,
    vectors: SteeringVectors,
    lam: float,
    how: SteerConfig = SteerConfig(),
    lora: Mapping[Site, LoraWeights] | None = None,
) -> Iterator[None]:
    """Steer forwards from this thread while active (module docstring). Constant modes add lam·delta at the
    vectors' sites; "conditional" adds (lam − 1)·s·B(A x) at every site of `lora` (default: read from
    vectors.adapter_path) of the MERGED model `model`, i.e. scales the adapter's own update by lam."""
    lam = float(lam)
    owner = threading.get_ident()
    state = {"prefill": False}
    if how.mode == "conditional":
        lora = lora if lora is not None else vectors.adapter_lora()
        sites = sort_sites(lora)
    else:
        sites = list(vectors.sites)
        deltas_np = vectors.deltas(how.mode, how.units)
    modules = [(s, site_module(model, s)) for s in sites]
    adds = {}
    for s, m in modules:
        p = next(m.parameters())
        if how.mode == "conditional":
            w = lora[s]
            if (
                getattr(m, "in_features", w.A.shape[1]) != w.A.shape[1]
                or getattr(m, "out_features", w.B.shape[0]) != w.B.shape[0]
            ):
                raise ModelError(
                    f"{s.key}: the adapter's LoRA is {w.B.shape[0]}×{w.A.shape[1]} but {s.path} is "
                    f"{m.out_features}×{m.in_features}; this adapter belongs to another model."
                )
            adds[s.key] = ((lam - 1.0) * w.scaling, w.A.to(p.device), w.B.to(p.device))
        else:
            v = torch.from_numpy(deltas_np[s.key])
            out_features = getattr(m, "out_features", None)
            if out_features is not None and out_features != v.shape[0]:
                raise ModelError(
                    f"{s.key}: steering vector has {v.shape[0]} dims but {s.path} outputs {out_features}; "
                    "these vectors belong to another model."
                )
            adds[s.key] = lam * v.to(p.device)

    def make_hook(key: str):
        add = adds[key]

        def hook(_module, inputs, output):
            if threading.get_ident() != owner or (how.positions == "generated" and state["prefill"]):
                return None
            if how.mode != "conditional":
                return output + add.to(output.dtype)
            factor, A, B = add
            if factor == 0.0:
                return None
            x = inputs[0]
            return output + (factor * ((x.float() @ A.T) @ B.T)).to(output.dtype)

        return hook

    def prefill_hook(_module, _args, kwargs):
        if threading.get_ident() == owner:
            state["prefill"] = _is_prefill(kwargs)
        return None

    handles = []
    try:
        with _HOOK_LOCK:
            if how.positions == "generated":
                handles.append(base_causal_lm(model).register_forward_pre_hook(prefill_hook, with_kwargs=True))
            for s, m in modules:
                handles.append(m.register_forward_hook(make_hook(s.key)))
        yield
    finally:
        with _HOOK_LOCK:
            for h in handles:
                h.remove()


_MODEL_LOCKS: "weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()
_SAMPLING_LOCK = threading.Lock()  # sampling seeds torch's global RNG: one sampled generation at a time


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The lock that guards generation on one model object (shared by every session on it)."""
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


class SteeringSession:
    """A merged model + steering vectors, kept by a UI. See the module docstring."""

    def __init__(self, lm: LoadedModel, vectors: SteeringVectors, check_base: bool = True):
        if check_base and vectors.base_fingerprint and vectors.base_fingerprint != lm.fingerprint:
            raise ModelError(
                f"Steering vectors were computed on base model {vectors.base_model!r} (fingerprint "
                f"{vectors.base_fingerprint}) but the session's model is {lm.spec.name!r} ({lm.fingerprint}); load the "
                "adapter's own base model (SteeringSession.from_run)."
            )
        for s in vectors.sites:
            site_module(lm.model, s)  # fail now, not mid-generation, when a site is missing
        self.lm = lm
        self.vectors = vectors
        self._lock = model_lock(lm.model)
        self._lora: dict[Site, LoraWeights] | None = None  # read on the first conditional generation

    def lora(self) -> dict[Site, LoraWeights]:
        """The adapter's LoRA pairs (the conditional mode's A, B, scaling), read once from vectors.adapter_path."""
        if self._lora is None:
            self._lora = self.vectors.adapter_lora()
        return self._lora

    @classmethod
    def from_run(cls, adapter, vectors: SteeringVectors, spec=None) -> "SteeringSession":
        """Load a fresh base model with the adapter's LoRA merged in (load_merged) and wrap it."""
        adapter = open_adapter(adapter)
        if vectors.adapter_fingerprint and vectors.adapter_fingerprint != adapter.fingerprint():
            raise ModelError(
                f"Steering vectors belong to adapter {vectors.adapter_fingerprint} ({vectors.adapter_path}), not to "
                f"{adapter.path} ({adapter.fingerprint()}); recompute them for this adapter (python -m topl_core "
                f"steer --run {adapter.path})."
            )
        return cls(load_merged(spec or adapter.base_model, adapter), vectors)

    @torch.no_grad()
    def generate_steered(
        self,
        document: str,
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> str:
        """One response for `document` steered with λ in mode `how` (λ = how.neutral: the merged model's output)."""
        return self.generate_many([document], lam, gen_cfg, task, how)[0]

    def generate_many(
        self,
        documents: Sequence[str],
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> list[str]:
        """One response per document at one λ, in left-padded batches of gen_cfg.batch_size (topl_core.generate).
        Greedy batched outputs can differ from one-at-a-time outputs in the last float bits (padding changes the
        matmul shapes); compare λ values within one mode."""
        lora = self.lora() if how.mode == "conditional" else None
        with self._lock, steer(self.lm.model, self.vectors, lam, how, lora):
            if gen_cfg.mode == "sample":
                with _SAMPLING_LOCK:
                    return generate(self.lm, documents, gen_cfg, task)
            return generate(self.lm, documents, gen_cfg, task)

    def generate_grid(
        self,
        document: str,
        lambdas: Sequence[float],
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> list[dict]:
        return [
            {"lambda": float(lam), "text": self.generate_steered(document, lam, gen_cfg, task, how)} for lam in lambdas
        ]
