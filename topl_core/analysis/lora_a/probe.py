"""The LoRA-A probe pipeline: an adapter + a labelled token set → the r-dim projections of every LoRA site (and of a
random-init A control on the same inputs) → per-site separability (analysis/separability.py) — each step cached on
disk by settings, records and adapter fingerprint (analysis/cache.py).

    ProbeSettings (frozen), probe_run(run, records, settings, token_set="", base=None, use_cache=True,
                                      progress=None) -> ProbeResult (lora + control Separability, cached)
    run_projections(run, records, settings, base=None, use_cache=True) -> dict[str, Projections] (cached npz)
    labelled_records(records) -> the records a probe can use
    labelled_split(adapter, split="val", limit=None) -> the labelled records of a split of the adapter's own data
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal, Sequence

import numpy as np

from ...data.records import Record, read_jsonl, records_fingerprint
from ...data.split import split_records
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError
from ...foundations.paths import project_path
from ...hardware.precision import PRECISION_HELP, PRECISIONS, Precision, resolve_precision
from ...models.loading import ModelSpec, load_model
from ...runtime.sites import input_module, lora_sites, lora_weights
from ...training.adapters import Adapter, load_adapter, open_adapter
from ..cache import cached, json_codec, npz_codec
from .capture import DEFAULT_SET, Projections, collect_projections, random_lora_A
from .separability import Separability, separability

CONTROL_SET = "random"  # the projection set of the random-init A control


@dataclass(frozen=True)
class ProbeSettings:
    """How to probe an adapter. max_doc_tokens / max_response_tokens None → the run's training values.

    Example: ``probe_run(adapter, records, ProbeSettings(folds=5, random_control=True, precision="fp32"))``"""

    select: Literal["labelled", "response"] = config_field(
        "labelled", label="Tokens", help="labelled: the tokens with a good / bad label; response: every response token"
    )
    batch_size: int = config_field(4, label="Batch size", help="records per forward pass", min=1, max=256)
    max_doc_tokens: int | None = config_field(
        None, label="Max document tokens", help="documents cut to this many tokens (none: the run's own)", min=1
    )
    max_response_tokens: int | None = config_field(
        None, label="Max response tokens", help="responses cut to this many tokens (none: the run's own)", min=1
    )
    # resolved for the run's device by resolved() (topl_core.hardware.precision)
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    folds: int = config_field(
        5, label="CV folds", help="folds of each site's cross-validated logistic regression", min=2, max=20
    )
    seed: int = config_field(0, label="Seed", help="seed of the folds", min=0)
    n_boot: int = config_field(
        2000, label="Bootstrap draws", help="bootstrap draws for the CI of the mean over sites", min=1
    )
    random_control: bool = config_field(
        True, label="Random-A control", help="also score a random-init A (same r) on the same inputs"
    )
    control_seed: int = config_field(0, label="Control seed", help="seed of the random-init A", min=0)

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ConfigError(
                f"ProbeSettings.folds={self.folds}: cross-validation needs at least 2 folds (paper-style: 5)."
            )
        if self.batch_size < 1:
            raise ConfigError(f"ProbeSettings.batch_size={self.batch_size}: must be at least 1.")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"ProbeSettings.precision={self.precision!r}: choose one of {PRECISIONS}.")

    def resolved(self, adapter: Adapter) -> "ProbeSettings":
        """Lengths and precision filled in from the adapter's run (or the workbench defaults)."""
        cfg = adapter.settings
        return replace(
            self,
            max_doc_tokens=self.max_doc_tokens if self.max_doc_tokens is not None else cfg.max_doc_tokens,
            max_response_tokens=self.max_response_tokens or cfg.max_response_tokens,
            precision=resolve_precision(self.precision, cfg.device),
        )

    def collect(self, model, tokenizer, records, select: str | None = None, **kw):
        """collect_projections with these settings' token selection (or `select`), batching, lengths and precision;
        `kw`: its keyword arguments (sites, controls, weights, keep_inputs, progress)."""
        return collect_projections(
            model,
            tokenizer,
            records,
            select or self.select,
            self.batch_size,
            self.max_doc_tokens,
            self.max_response_tokens,
            self.precision,
            **kw,
        )

    def capture_key(self) -> dict:
        """The fields that change the captured projections (batch size does not)."""
        d = asdict(self)
        for k in ("folds", "seed", "n_boot", "batch_size"):
            d.pop(k)
        return d


@dataclass(frozen=True)
class ProbeResult:
    run: str
    adapter_fingerprint: str
    base_fingerprint: str | None
    token_set: str
    records_fingerprint: str
    settings: dict
    lora: Separability
    control: Separability | None = None

    def to_json(self) -> dict:
        return {
            **{
                k: getattr(self, k)
                for k in (
                    "run",
                    "adapter_fingerprint",
                    "base_fingerprint",
                    "token_set",
                    "records_fingerprint",
                    "settings",
                )
            },
            "lora": self.lora.to_json(),
            "control": self.control.to_json() if self.control else None,
        }

    @classmethod
    def from_json(cls, d: dict) -> "ProbeResult":
        return cls(
            **{
                **d,
                "lora": Separability.from_json(d["lora"]),
                "control": Separability.from_json(d["control"]) if d.get("control") else None,
            }
        )


def run_projections(
    adapter, records, settings: ProbeSettings = ProbeSettings(), base=None, use_cache: bool = True, progress=None
) -> dict[str, Projections]:
    """Projections of the adapter's LoRA-A (key "lora") and, with settings.random_control, of a random-init A
    (key "random") on the same inputs, for `records`. Cached as npz keyed by settings + records + adapter.
    `adapter`: anything open_adapter opens (a run, a PEFT folder, a hub id). `base` (a LoadedModel the caller
    gives away: the adapter is injected into it) defaults to a fresh load of the adapter's base model."""
    adapter = open_adapter(adapter)
    settings = settings.resolved(adapter)
    key = {"analysis": "lora_projections", "settings": settings.capture_key(), "records": records_fingerprint(records)}

    def compute() -> dict[str, Projections]:
        lm = base or load_model(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device))
        model = load_adapter(lm, adapter)
        sites = lora_sites(model)
        controls = None
        if settings.random_control:
            r_of = {s: lora_weights(model, s).r for s in sites}
            d_in = {s: input_module(model, s).in_features for s in sites}
            controls = {CONTROL_SET: random_lora_A(sites, r_of, d_in, settings.control_seed)}
        out = settings.collect(model, lm.tokenizer, records, sites=sites, controls=controls, progress=progress)
        return out if isinstance(out, dict) else {DEFAULT_SET: out}

    def to_arrays(sets: dict[str, Projections]) -> dict[str, np.ndarray]:
        return {f"{name}::{k}": v for name, p in sets.items() for k, v in p.to_arrays().items()}

    def from_arrays(arrays) -> dict[str, Projections]:
        names = sorted({k.split("::", 1)[0] for k in arrays})
        return {
            n: Projections.from_arrays({k.split("::", 1)[1]: v for k, v in arrays.items() if k.startswith(n + "::")})
            for n in names
        }

    return cached(
        "lora_projections", key, compute, npz_codec(to_arrays, from_arrays), adapter=adapter, enabled=use_cache
    )


def probe_run(
    adapter,
    records,
    settings: ProbeSettings = ProbeSettings(),
    token_set: str = "",
    base=None,
    use_cache: bool = True,
    progress=None,
) -> ProbeResult:
    """Per-site separability of an adapter's LoRA-A (and the random-A control) on a labelled token set. Cached
    (json) by settings + records + adapter fingerprint + base fingerprint; the projections are cached too (npz).

    Example: ``res = probe_run(adapter, labelled_split(adapter, limit=48)); res.lora.figure(), res.control.mean``"""
    adapter = open_adapter(adapter)
    settings = settings.resolved(adapter)
    rfp = records_fingerprint(records)
    key = {"analysis": "lora_separability", "settings": asdict(settings), "records": rfp}

    def compute() -> ProbeResult:
        sets = run_projections(adapter, records, settings, base, use_cache, progress)
        n_layers, name = adapter.num_layers, adapter.name
        lora = separability(sets[DEFAULT_SET], name, settings.folds, settings.seed, settings.n_boot, n_layers)
        control = None
        if CONTROL_SET in sets:
            control = separability(
                sets[CONTROL_SET], f"{name} random-A", settings.folds, settings.seed, settings.n_boot, n_layers
            )
        return ProbeResult(
            str(adapter.path),
            adapter.fingerprint(),
            adapter.base_fingerprint,
            token_set,
            rfp,
            asdict(settings),
            lora,
            control,
        )

    res = cached(
        "lora_separability",
        key,
        compute,
        json_codec(ProbeResult.to_json, ProbeResult.from_json),
        adapter=adapter,
        enabled=use_cache,
    )
    return replace(res, token_set=token_set or res.token_set)


def labelled_records(records: Sequence) -> list:
    """Records with token labels (token_labels_known): the ones a separability probe can use."""
    return [r for r in records if r.token_labels_known]


# records of the default token sets: the LoRA-A page's and the Runs page's indicator table; the Steering page's and the
# service's steering vectors (the demo adapters' are shipped for it: examples/analysis-cache)
TOKEN_SET_RECORDS = 48
STEERING_TOKEN_RECORDS = 16


def labelled_split(adapter, split: str = "val", limit: int | None = None) -> list[Record]:
    """The token-labelled records of `split` ("train", "val", "test") of the adapter's own data, split as it was
    trained (a run's data and split seed; the default data set for an adapter from elsewhere); the first `limit`.
    The token set the LoRA-A and Steering pages, decks and the evaluation's steering vectors open on.

    Example: ``records = labelled_split("examples/adapters/topl-smollm2", limit=48)``"""
    cfg = open_adapter(adapter).settings
    records = labelled_records(split_records(read_jsonl(project_path(cfg.data)), seed=cfg.split_seed)[split])
    return records[:limit] if limit is not None else records
