"""What a training method is: one `Method` value holds everything about it — the data its loss reads, whether packed
rows keep its loss, whether side probes can learn beside it, where its head reads, whether it is defined with LoRA
on every layer, its loss step and validator, and the paper's hyperparameters for each model-family preset. Each
method is one module of this package; `methods/__init__.py` registers them, and the trainer, TrainConfig's
validation, the presets, the CLI and the Train page read that registry (nothing else branches on a method's name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ...data.encode import Batch
from ...data.records import Record
from ...foundations.errors import ConfigError, DataError
from ...foundations.presets import MethodHyper
from ..batching import EncodeSettings, make_batches
from ..steps import StepContext, Validator

# what a method's loss reads from a record; Method.check_data tells the user when the data lacks it
Requirement = Literal["token_labels", "pairs", "sequence_labels", "faithful"]
# where the head reads FinalNorm(layer): after the last LoRA layer m, after the model's last layer, or no head
HeadPosition = Literal["lora_end", "last", "none"]
LossStep = Callable[[StepContext, Batch], tuple[torch.Tensor, dict]]
Prepare = Callable[[object, Sequence[Record], EncodeSettings], list]


@dataclass(frozen=True)
class Method:
    name: str
    label: str  # how pages name it ("TOPL", "unlikelihood")
    description: str
    requires: Requirement
    loss: LossStep  # (context, batch) → (loss, info)
    prepare: Prepare  # records → the examples the loss reads
    validate: Validator
    # the paper's hyperparameters per model-family preset (presets.PRESETS' keys; docs/design.md §2)
    paper: dict[str, MethodHyper]
    head_position: HeadPosition = "none"
    batches: Callable[[Sequence, int, int], list[Batch]] = make_batches
    # the loss is a mean over tokens, which packed rows (several examples a row, each masked to itself) leave as it is
    packable: bool = False
    # a token head's labels, which side probes at layers below the head can learn from in the same forward
    probed: bool = False
    lora_all_layers: bool = False  # the method is defined with LoRA on every layer (TLDR)
    validation_metric: str = "val_loss"  # the headline validation number (tables, progress)
    # the info key counting what the loss averages over (tokens, sequences, pairs): micro-batches are weighted by it
    units_key: str = "supervised_tokens"

    @property
    def uses_head(self) -> bool:
        return self.head_position != "none"

    @property
    def pairs(self) -> bool:
        """Its batches hold (chosen, rejected) pairs: twice the rows."""
        return self.units_key == "pairs"

    def head_layer(self, lora_end: int, num_layers: int) -> int | None:
        return {"lora_end": lora_end, "last": num_layers - 1, "none": None}[self.head_position]

    def hyper(self, preset: str) -> MethodHyper:
        """The paper's learning rate, batch and LoRA extent of this method for a model-family preset."""
        if preset not in self.paper:
            raise ConfigError(
                f"preset={preset!r}: method {self.name!r} has no paper hyperparameters for it; choose one of "
                f"{sorted(self.paper)}, or set lr, batch size and LoRA layers yourself."
            )
        return self.paper[preset]

    def check_data(self, records: Sequence[Record]) -> None:
        """Fail before training when the data lacks what this method needs; the message says what is missing."""
        if not records:
            raise DataError(f"{self.name}: the training split is empty; build or import more data.")
        n = len(records)
        if self.requires == "token_labels" and not any(r.token_labels_known for r in records):
            raise DataError(
                f"{self.name} needs token-level labels, but all {n} training records have only a sequence label "
                "(token_labels_known=false). Build perturbation data (python -m topl_core data build) or import "
                "FAVA/CLIFF spans."
            )
        if self.requires == "pairs" and not any(r.sequence_label == 0 and r.faithful_response for r in records):
            raise DataError(
                f"{self.name} needs (faithful, unfaithful) pairs — unfaithful records (sequence_label 0) whose "
                f"faithful_response holds the faithful response to the same prompt — but none of the {n} training "
                "records has one. Use perturbation data (python -m topl_core data build) or HaluEval pairs."
            )
        if self.requires == "sequence_labels" and len({r.sequence_label for r in records}) < 2:
            only = records[0].sequence_label
            raise DataError(
                f"{self.name} needs both faithful (sequence_label 1) and unfaithful (sequence_label 0) responses, but "
                f"all {n} training records have sequence_label {only}. Add perturbed/hallucinated or faithful "
                "responses."
            )
        if self.requires == "faithful" and not any(r.sequence_label == 1 or r.faithful_response for r in records):
            raise DataError(
                f"{self.name} trains on faithful responses, but none of the {n} training records is faithful "
                "(sequence_label 1) or carries a faithful_response. Add the faithful summaries."
            )
