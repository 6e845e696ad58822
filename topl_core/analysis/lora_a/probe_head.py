"""A head for any adapter: a linear probe fitted on its frozen hidden states, where a TOPL run trained one.

The Token overlay and the head-based metrics read p(good) = σ(w·H + b) with H = FinalNorm(f_0:m(x)), the input of a
TOPL head (docs/design.md §1). An adapter trained elsewhere (or by SFT, DPO, …) has no head; `fit_probe_head` fits
one on the same H — layer m = the adapter's last LoRA layer by default, the model's final norm applied, the adapter
active, the model frozen — by L2 logistic regression (C = 1, features standardised, separability.fit_logistic) on
the labelled tokens of the training split, and reports its token AUROC on the validation split. The same probe on
the base model (adapter disabled) is the data-matched frozen-probe control: what the adapter adds over a probe of
the model it started from.

    ProbeHeadSettings(layer=None, max_records=48, max_val_records=24, C=1.0, ...)
    fit_probe_head(adapter, records, settings, adapter_enabled=True, base=None, use_cache=True) -> ProbeHead
    ProbeHead.linear(device) -> nn.Linear     drop-in for a run's head (TokenScorer)

Fitted heads are cached under cache/analysis/probe_head/ keyed by the adapter's fingerprint, the records and the
settings — never written into the adapter's folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np
import torch

from ...data.encode import collate, encode_record
from ...data.records import Record, records_fingerprint
from ...data.split import split_records
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError, DataError
from ...foundations.metrics import auroc
from ...hardware.precision import PRECISION_HELP, PRECISIONS, Precision, autocast, resolve_precision, to_numpy
from ...models.forward import head_features
from ...models.loading import ModelSpec, load_model
from ...runtime.sites import lora_sites
from ...training.adapters import load_adapter, open_adapter
from ..cache import cached, json_codec
from .separability import fit_logistic


@dataclass(frozen=True)
class ProbeHeadSettings:
    layer: int | None = config_field(
        None,
        label="Layer",
        help="the layer whose output the head reads (none: the adapter's last LoRA layer; a run with a head: its "
        "head's)",
        min=0,
    )
    # their forward passes are most of a fit's time (docs/performance.md)
    max_records: int = config_field(
        48, label="Training records", help="labelled training records the head is fitted on", min=1
    )
    max_val_records: int = config_field(
        24, label="Validation records", help="labelled validation records it is scored on", min=1
    )
    C: float = config_field(
        1.0, label="C", help="inverse L2 strength, as sklearn's LogisticRegression", min=1e-6, max=1e6
    )
    batch_size: int = config_field(4, label="Batch size", help="records per forward pass", min=1, max=256)
    # resolved for the adapter's device before it keys the cache (fit_probe_head)
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    split_seed: int = config_field(0, label="Split seed", help="seed of the split the records come from", min=0)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"ProbeHeadSettings.precision={self.precision!r}: choose one of {PRECISIONS}.")


@dataclass(frozen=True)
class ProbeHead:
    """A fitted linear head: p(good) = σ(weight · H + bias), H = FinalNorm(hidden after `layer`)."""

    layer: int
    weight: tuple[float, ...]
    bias: float
    adapter_enabled: bool  # False: fitted on the base model (the frozen-probe control)
    train_auroc: float
    val_auroc: float
    n_train_tokens: int
    n_val_tokens: int
    settings: dict

    def linear(self, device: str | torch.device = "cpu") -> torch.nn.Linear:
        head = torch.nn.Linear(len(self.weight), 1)
        with torch.no_grad():
            head.weight.copy_(torch.tensor([self.weight], dtype=torch.float32))
            head.bias.fill_(self.bias)
        return head.to(device).eval()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ProbeHead":
        return cls(**{**d, "weight": tuple(d["weight"])})


def default_probe_layer(adapter, model: torch.nn.Module) -> int:
    """Layer m of the probe: a run's head layer, else the adapter's last LoRA layer."""
    if adapter.head_layer is not None:
        return adapter.head_layer
    return max(s.layer for s in lora_sites(model))


@torch.no_grad()
def _features(model, tokenizer, records: Sequence[Record], layer: int, cfg, settings: ProbeHeadSettings):
    """(H at every labelled response token, its label 1 good / 0 bad)."""
    xs, ys = [], []
    encoded = [encode_record(tokenizer, r, cfg.max_doc_tokens, cfg.max_response_tokens) for r in records]
    for i in range(0, len(encoded), settings.batch_size):
        chunk = encoded[i : i + settings.batch_size]
        b = collate(chunk, tokenizer.pad_token_id).to(model.device)
        with autocast(settings.precision, model.device.type):
            h = to_numpy(head_features(model, b.input_ids, b.attention_mask, layer))
        for j, e in enumerate(chunk):
            labels = e.response_labels
            keep = labels >= 0
            xs.append(h[j, e.response_start : e.response_end][keep])
            ys.append(labels[keep])
    if not xs:
        return np.zeros((0, 0)), np.zeros(0)
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.int64)


def fit_probe_head(
    adapter,
    records: Sequence[Record],
    settings: ProbeHeadSettings = ProbeHeadSettings(),
    adapter_enabled: bool = True,
    base=None,
    use_cache: bool = True,
) -> ProbeHead:
    """Fit a linear probe head on the adapter's frozen hidden states (or, adapter_enabled=False, on the base
    model's: the frozen-probe control) from the labelled tokens of `records`' training split; report its token
    AUROC on their validation split. Cached by adapter fingerprint + records + settings."""
    adapter = open_adapter(adapter)
    # the cache key says what ran: "auto" resolved for the adapter's device
    settings = replace(settings, precision=resolve_precision(settings.precision, adapter.device))
    labelled = [r for r in records if r.token_labels_known]
    if not labelled:
        raise DataError(
            "fitting a probe head needs token-labelled records (token_labels_known); build perturbation data "
            "(python -m topl_core data build) or import FAVA / CLIFF spans."
        )
    splits = split_records(labelled, seed=settings.split_seed)
    train, val = splits["train"][: settings.max_records], splits["val"][: settings.max_val_records]
    key = {
        "analysis": "probe_head",
        "settings": asdict(settings),
        "adapter_enabled": adapter_enabled,
        "records": records_fingerprint(labelled),
    }

    def compute() -> ProbeHead:
        cfg = adapter.settings
        lm = base or load_model(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device))
        model = load_adapter(lm, adapter)
        layer = settings.layer if settings.layer is not None else default_probe_layer(adapter, model)

        def features(recs):
            if adapter_enabled:
                return _features(model, lm.tokenizer, recs, layer, cfg, settings)
            with model.disable_adapter():
                return _features(model, lm.tokenizer, recs, layer, cfg, settings)

        X, y = features(train)
        if len(set(y.tolist())) < 2:
            raise DataError(f"the {len(train)} training records hold only one token label; the probe needs both.")
        w, b, mean, scale = fit_logistic(X, y, C=settings.C)
        weight, bias = w / scale, b - float((mean / scale) @ w)  # the same scores on raw (unstandardised) H
        Xv, yv = features(val) if val else (np.zeros((0, X.shape[1])), np.zeros(0))
        return ProbeHead(
            layer,
            tuple(float(v) for v in weight),
            float(bias),
            adapter_enabled,
            float(auroc(y == 1, X @ weight + bias)),
            float(auroc(yv == 1, Xv @ weight + bias)) if len(yv) else float("nan"),
            int(len(y)),
            int(len(yv)),
            asdict(settings),
        )

    return cached(
        "probe_head",
        key,
        compute,
        json_codec(ProbeHead.to_json, ProbeHead.from_json),
        adapter=adapter,
        enabled=use_cache,
    )
