"""A run's inputs, made before its first step (trainer.py): the records read, split by document and checked against
the method before the model loads, the base model, the encoded train / validation examples in their batches (the label
setting applied to the training ones), and what topl_config.json records of them beside the config.

    prepare_inputs(cfg, method, records, base) -> (LoadedModel, RunBatches)
    run_meta(cfg, method, base, batches) -> dict     the base model and what the run trained on
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Sequence

from ..data.encode import Encoded
from ..data.label_settings import apply_label_setting
from ..data.records import Record, read_jsonl, records_fingerprint
from ..data.split import split_records
from ..foundations.errors import DataError
from ..models.architecture import check_layer_range
from ..models.loading import LoadedModel, ModelSpec, load_model
from .batching import EncodeSettings, length_buckets, make_packed_batches
from .config import TrainConfig
from .methods import Method


def _apply_label_setting(examples: list[Encoded], setting: str, seed: int) -> list[Encoded]:
    if setting == "original":
        return examples
    new = apply_label_setting([e.response_labels for e in examples], setting, seed)
    out = []
    for e, lab in zip(examples, new):
        labels = e.labels.copy()
        labels[e.response_start : e.response_end] = lab
        out.append(replace(e, labels=labels))
    return out


@dataclass
class RunBatches:
    train: list  # one entry per batch of cfg.batch_size examples (length-bucketed), each as its micro-batches
    val: list
    n_train: int
    n_val: int
    data_fingerprint: str  # of every record read (topl_core.data.records.records_fingerprint), before the split


def prepare_inputs(
    cfg: TrainConfig, method: Method, records: Sequence[Record] | None, base: LoadedModel | None
) -> tuple[LoadedModel, RunBatches]:
    """The data, checked before the model loads (a method given data it cannot use fails at once), the base model
    and the encoded, batched train / validation examples."""
    records = list(records) if records is not None else read_jsonl(cfg.data)
    splits = split_records(records, seed=cfg.split_seed)
    method.check_data(splits["train"])
    base = base or load_model(ModelSpec.computing(cfg.model, cfg.precision, cfg.device))
    check_layer_range(base.num_layers, cfg.lora.layer_start, cfg.lora.layer_end)
    if method.lora_all_layers and not _lora_on_all_layers(cfg, base):
        warnings.warn(
            f"{cfg.method} is defined with LoRA on all layers, but lora layers are "
            f"{cfg.lora.layer_start}-{cfg.lora.layer_end} "
            f"of 0-{base.num_layers - 1}; set lora.layer_start=0, lora.layer_end={base.num_layers - 1} to match the "
            "paper.",
            stacklevel=3,
        )
    enc = EncodeSettings(cfg.max_doc_tokens, cfg.max_response_tokens)
    train_ex = _apply_label_setting(method.prepare(base.tokenizer, splits["train"], enc), cfg.label_setting, cfg.seed)
    val_ex = method.prepare(base.tokenizer, splits["val"][: cfg.max_val_examples], enc) if splits["val"] else []
    if not train_ex:
        raise DataError(
            f"{cfg.method}: no training example could be built from {len(splits['train'])} training records."
        )
    pad = base.tokenizer.pad_token_id
    micro_batches = make_packed_batches if cfg.packing else method.batches
    train_batches = [
        micro_batches(group, cfg.micro_batch_size, pad) for group in length_buckets(train_ex, cfg.batch_size)
    ]
    val_batches = method.batches(val_ex, cfg.batch_size, pad) if val_ex else []
    return base, RunBatches(train_batches, val_batches, len(train_ex), len(val_ex), records_fingerprint(records))


def _lora_on_all_layers(cfg: TrainConfig, base: LoadedModel) -> bool:
    return cfg.lora.layer_start == 0 and cfg.lora.layer_end == base.num_layers - 1


def run_meta(cfg: TrainConfig, method: Method, base: LoadedModel, batches: RunBatches) -> dict:
    """What topl_config.json records beside the config: the base model and what the run trained on."""
    return {
        "base_model": cfg.model,
        "base_fingerprint": base.fingerprint,
        "model_type": base.model.config.model_type,
        "num_layers": base.num_layers,
        "hidden_size": base.model.config.hidden_size,
        "head_layer": method.head_layer(cfg.lora.layer_end, base.num_layers),
        "n_train_examples": batches.n_train,
        "n_val_examples": batches.n_val,
        "data_fingerprint": batches.data_fingerprint,
        "objective": method.description,
        "validation_metric": method.validation_metric,
        "lora_all_layers": _lora_on_all_layers(cfg, base),
    }
