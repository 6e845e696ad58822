"""Training objectives: small pure loss functions plus a registry that the one training loop drives.

An Objective says what data it needs (checked before training starts), where its head sits (if it has one),
how to turn records into examples, and how to compute the loss of one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F

from ..data.encode import IGNORE, Batch, Encoded, collate, encode_record
from ..data.records import DataError, Record
from ..forward import head_features

Requirement = Literal["token_labels", "pairs", "sequence_labels"]


# --- pure losses --------------------------------------------------------------------------------------------


def token_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of per-token head logits against labels 1 (good) / 0 (bad); -1 ignored."""
    mask = labels != IGNORE
    if not mask.any():
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[mask].float(), labels[mask].float())


# --- the registry -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepContext:
    """What a loss step may use: the PEFT model, the head (or None), the head layer m, the config."""

    model: torch.nn.Module
    head: torch.nn.Module | None
    head_layer: int | None
    beta: float


@dataclass(frozen=True)
class Objective:
    name: str
    description: str
    requires: frozenset[str]
    head_position: Literal["lora_end", "last", "none"]
    loss: Callable[[StepContext, Batch], tuple[torch.Tensor, dict]]
    prepare: Callable[[object, Sequence[Record], "EncodeSettings"], list] | None = None

    @property
    def uses_head(self) -> bool:
        return self.head_position != "none"

    def head_layer(self, lora_end: int, num_layers: int) -> int | None:
        return {"lora_end": lora_end, "last": num_layers - 1, "none": None}[self.head_position]

    def check_data(self, records: Sequence[Record]) -> None:
        """Fail before training when the data lacks what this method needs."""
        if not records:
            raise DataError(f"{self.name}: the training split is empty; build or import more data.")
        if "token_labels" in self.requires and not any(r.token_labels_known for r in records):
            raise DataError(
                f"{self.name} needs token-level labels, but every record has only a sequence label "
                "(token_labels_known=false). Build perturbation data (python -m topl_core data build) or import FAVA/CLIFF spans."
            )
        if "pairs" in self.requires and not any(r.faithful_response for r in records):
            raise DataError(
                f"{self.name} needs (faithful, unfaithful) pairs, but no record has a faithful_response. "
                "Use perturbation data or HaluEval pairs."
            )


@dataclass(frozen=True)
class EncodeSettings:
    max_doc_tokens: int
    max_response_tokens: int


def encode_token_labelled(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    """Every record whose token labels are known, encoded with per-token labels."""
    return [
        encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens) for r in records if r.token_labels_known
    ]


def head_logits(ctx: StepContext, batch: Batch) -> torch.Tensor:
    """Per-token head logits (B, T) in float32: h(FinalNorm(f_{0:m}(x)))."""
    h = head_features(ctx.model, batch.input_ids, batch.attention_mask, ctx.head_layer)
    return ctx.head(h).squeeze(-1).float()


def topl_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    logits = head_logits(ctx, batch)
    loss = token_bce_loss(logits, batch.labels)
    return loss, {"supervised_tokens": int((batch.labels != IGNORE).sum())}


OBJECTIVES: dict[str, Objective] = {
    "topl": Objective(
        name="topl",
        description="Token-level off-policy labeling: BCE of a linear head on FinalNorm(layer m) over response tokens.",
        requires=frozenset({"token_labels"}),
        head_position="lora_end",
        loss=topl_loss_step,
        prepare=encode_token_labelled,
    ),
}


def make_batches(examples: Sequence[Encoded], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-bucketed batches (sorted by length, then chunked): little padding and a few repeated shapes."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    return [collate([examples[i] for i in order[k : k + batch_size]], pad_id) for k in range(0, len(order), batch_size)]
