"""Training objectives: the registry that the one training loop drives (its pure losses are in losses.py, what a
step and a validation compute from the model in steps.py, records → batches in batching.py).

An Objective says what data it needs (checked before training starts), where its head sits (if it has one),
how to turn records into examples and examples into batches, how to compute the loss of one batch, and how to
validate. The methods (docs/design.md §2):

- topl: BCE of a linear head on FinalNorm(layer m) per response token (m = last LoRA layer).
- tldr: the same token-level BCE reward model with the head on the *last* layer and LoRA on all layers.
- sopl: the sequence-level twin of TOPL: one BCE label per response (faithful 1, perturbed 0) on the **mean of the
  per-token head logits over the response tokens** (end-of-turn token excluded), head after layer m.
- sft: next-token cross-entropy on the faithful responses only (records with sequence_label 1, plus the
  faithful_response of pairs whose faithful record is absent), on the response tokens and the end-of-turn token.
- unlikelihood: on token-labelled responses (faithful and perturbed), −log p(token) on good tokens and
  −log(1 − p(token)) on bad tokens, averaged over supervised tokens; the end-of-turn token of a faithful response
  counts as good, that of a perturbed response is not supervised.
- dpo: chosen = faithful_response, rejected = the perturbed/hallucinated response of the same prompt;
  −log σ(β[(log π_θ − log π_ref)(y_w) − (log π_θ − log π_ref)(y_l)]), log-probs summed over response + end-of-turn.
- tdpo: TDPO2 of Zeng et al. 2024 (α = cfg.tdpo_alpha, paper default 0.5): the DPO margin minus
  α·(β·SeqKL(y_l) − sg(β·SeqKL(y_w))), where SeqKL(y) = Σ_t KL(π_ref(·|x, y_<t) ‖ π_θ(·|x, y_<t)) over the
  response + end-of-turn positions. `tdpo_loss(..., variant="tdpo1")` gives TDPO1 (α = 1, no stop-gradient).

The reference policy of dpo/tdpo is the same PEFT model with its adapter disabled (`model.disable_adapter()`):
no second copy of the weights. At initialisation (LoRA B = 0) policy and reference coincide exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch

from ..data.encode import Batch
from ..data.records import Record
from ..errors import DataError
from .batching import (
    EncodeSettings,
    encode_all,
    encode_faithful,
    encode_pairs,
    encode_token_labelled,
    make_batches,
    make_pair_batches,
)
from .config import METHOD_DATA, Requirement
from .steps import (
    StepContext,
    Validator,
    dpo_loss_step,
    mean_loss_validator,
    sft_loss_step,
    sopl_loss_step,
    tdpo_loss_step,
    topl_loss_step,
    unlikelihood_loss_step,
    validate_head,
    validate_sopl,
    validate_unlikelihood,
)


@dataclass(frozen=True)
class Objective:
    name: str
    description: str
    head_position: Literal["lora_end", "last", "none"]
    loss: Callable[[StepContext, Batch], tuple[torch.Tensor, dict]]
    prepare: Callable[[object, Sequence[Record], EncodeSettings], list] | None = None
    batches: Callable[[Sequence, int, int], list[Batch]] = make_batches
    validate: Validator | None = None
    lora_all_layers: bool = False  # the method is defined with LoRA on every layer (TLDR)
    validation_metric: str = "val_loss"  # the headline validation number (tables, progress)
    # the info key counting what the loss averages over (tokens, sequences, pairs): micro-batches are weighted by it
    units_key: str = "supervised_tokens"

    @property
    def requires(self) -> Requirement:
        return METHOD_DATA[self.name]

    @property
    def uses_head(self) -> bool:
        return self.head_position != "none"

    def head_layer(self, lora_end: int, num_layers: int) -> int | None:
        return {"lora_end": lora_end, "last": num_layers - 1, "none": None}[self.head_position]

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


OBJECTIVES: dict[str, Objective] = {
    "topl": Objective(
        name="topl",
        description="Token-level off-policy labeling: BCE of a linear head on FinalNorm(layer m) over response tokens.",
        head_position="lora_end",
        loss=topl_loss_step,
        prepare=encode_token_labelled,
        validate=validate_head,
        validation_metric="val_token_auroc",
    ),
    "tldr": Objective(
        name="tldr",
        description="TLDR token-level reward model: BCE of a linear head on FinalNorm(last layer) per response token, "
        "LoRA on all layers.",
        head_position="last",
        loss=topl_loss_step,
        prepare=encode_token_labelled,
        validate=validate_head,
        lora_all_layers=True,
        validation_metric="val_token_auroc",
    ),
    "sopl": Objective(
        name="sopl",
        description="Sequence-level labeling: BCE of the mean head logit over response tokens (head on "
        "FinalNorm(layer m)); faithful 1, perturbed 0.",
        head_position="lora_end",
        loss=sopl_loss_step,
        prepare=encode_all,
        validate=validate_sopl,
        validation_metric="val_seq_auroc",
        units_key="supervised_sequences",
    ),
    "sft": Objective(
        name="sft",
        description="Supervised fine-tuning: next-token cross-entropy on faithful responses (response + end-of-turn "
        "tokens).",
        head_position="none",
        loss=sft_loss_step,
        prepare=encode_faithful,
        validate=mean_loss_validator(sft_loss_step, ()),
        validation_metric="val_loss",
    ),
    "unlikelihood": Objective(
        name="unlikelihood",
        description="Token-level unlikelihood: −log p on good tokens, −log(1 − p) on bad tokens of token-labelled "
        "responses.",
        head_position="none",
        loss=unlikelihood_loss_step,
        prepare=encode_token_labelled,
        validate=validate_unlikelihood,
        validation_metric="val_token_auroc_logp",
    ),
    "dpo": Objective(
        name="dpo",
        description="DPO: chosen = faithful response, rejected = perturbed response; reference = the model with its "
        "adapter disabled.",
        head_position="none",
        loss=dpo_loss_step,
        prepare=encode_pairs,
        batches=make_pair_batches,
        validate=mean_loss_validator(dpo_loss_step, ("reward_accuracy", "reward_margin")),
        validation_metric="val_reward_accuracy",
        units_key="pairs",
    ),
    "tdpo": Objective(
        name="tdpo",
        description="TDPO2 (Zeng et al. 2024): DPO margin minus α·(β·SeqKL(rejected) − sg(β·SeqKL(chosen))), KL(π_ref "
        "‖ π_θ) per token; reference = adapter disabled.",
        head_position="none",
        loss=tdpo_loss_step,
        prepare=encode_pairs,
        batches=make_pair_batches,
        validate=mean_loss_validator(tdpo_loss_step, ("reward_accuracy", "reward_margin")),
        validation_metric="val_reward_accuracy",
        units_key="pairs",
    ),
}
