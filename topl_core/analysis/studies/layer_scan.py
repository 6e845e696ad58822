"""The frozen probe at every layer from one forward (transfer.py reports the chosen layer's detection): the layer
scan, on development data only."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ...data.encode import IGNORE, collate, encode_record
from ...data.records import Record, records_fingerprint
from ...data.split import split_records
from ...foundations.errors import ConfigError
from ...foundations.metrics import auroc
from ...hardware.precision import autocast, resolve_precision, to_numpy
from ...models.architecture import decoder_layers, final_norm
from ...models.forward import hidden_after_layer
from ...models.loading import ModelSpec, load_model
from ...training.adapters import load_adapter, open_adapter
from ..cache import PARQUET, cached
from ..lora_a.separability import fit_logistic
from .transfer import TransferSettings, evaluation_sets, load_cliff, training_records


@torch.no_grad()
def _features_by_layer(
    model, tokenizer, records: Sequence[Record], layers: Sequence[int], cfg, settings: TransferSettings
) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """H = FinalNorm(hidden after layer l) at every labelled response token, for each l of `layers` from one forward
    per batch (stopping after the last of them), and the tokens' labels (1 good / 0 bad)."""
    features: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
    labels: list[np.ndarray] = []
    captured: dict[int, torch.Tensor] = {}
    norm, blocks = final_norm(model), decoder_layers(model)
    precision = resolve_precision(settings.precision, model.device.type)

    def keep(layer):
        return lambda _m, _i, out: captured.__setitem__(layer, out[0] if isinstance(out, tuple) else out)

    handles = [blocks[layer].register_forward_hook(keep(layer)) for layer in layers]
    try:
        encoded = [encode_record(tokenizer, r, cfg.max_doc_tokens, cfg.max_response_tokens) for r in records]
        for i in range(0, len(encoded), settings.batch_size):
            chunk = encoded[i : i + settings.batch_size]
            b = collate(chunk, tokenizer.pad_token_id).to(model.device)
            with autocast(precision, model.device.type):
                hidden_after_layer(model, b.input_ids, b.attention_mask, max(layers))
                normed = {layer: to_numpy(norm(captured[layer])) for layer in layers}
            for j, e in enumerate(chunk):
                mask = e.response_labels != IGNORE
                labels.append(e.response_labels[mask])
                for layer in layers:
                    features[layer].append(normed[layer][j, e.response_start : e.response_end][mask])
    finally:
        for h in handles:
            h.remove()
    return {layer: np.concatenate(f).astype(np.float32) for layer, f in features.items()}, np.concatenate(labels)


def layer_scan(
    adapter,
    settings: TransferSettings = TransferSettings(),
    layers: Sequence[int] | None = None,
    cliff_path: str | Path | None = None,
    records: Sequence[Record] | None = None,
    adapter_enabled: bool = False,
) -> pd.DataFrame:
    """The frozen probe (adapter_enabled=False) or a probe of the adapter's states at every layer in `layers`
    (default: all), fitted on `settings.probe_records` training records, scored on the dev sets: its AUROC of
    flagging bad tokens per (layer, set). Held-out sets are refused: choosing a layer is development."""
    if settings.stage != "dev":
        raise ConfigError("a layer scan chooses layer m, so it reads the dev sets only: use stage='dev'.")
    adapter = open_adapter(adapter)
    labelled = training_records(adapter, records)
    cliff, _ = load_cliff(cliff_path, settings.detokenized_cliff)
    sets = evaluation_sets(adapter, "dev", labelled, cliff, settings.max_records_per_set)
    train = split_records(labelled, seed=adapter.settings.split_seed)["train"][: settings.probe_records]
    key = {
        "analysis": "layer_scan",
        "layers": list(layers) if layers is not None else None,
        "sets": {name: records_fingerprint(recs) for name, recs in sets.items()},
        "train": records_fingerprint(train),
        "adapter_enabled": adapter_enabled,
        "precision": resolve_precision(settings.precision, adapter.device),
    }

    def compute() -> pd.DataFrame:
        lm = load_model(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device))
        model = load_adapter(lm, adapter)
        scan = list(layers) if layers is not None else list(range(len(decoder_layers(model))))
        context = contextlib.nullcontext() if adapter_enabled else model.disable_adapter()
        with context:
            X, y = _features_by_layer(model, lm.tokenizer, train, scan, adapter.settings, settings)
            dev = {
                name: _features_by_layer(model, lm.tokenizer, recs, scan, adapter.settings, settings)
                for name, recs in sets.items()
                if recs
            }
        rows = []
        for layer in scan:
            w, b, mean, scale = fit_logistic(X[layer], y)
            for name, (Xd, yd) in dev.items():
                good = ((Xd[layer] - mean) / scale) @ w + b
                rows.append(dict(layer=layer, set=name, auroc=auroc(yd == 0, -good), tokens=len(yd)))
        return pd.DataFrame(rows, columns=["layer", "set", "auroc", "tokens"])

    return cached("layer_scan", key, compute, PARQUET, adapter=adapter)
