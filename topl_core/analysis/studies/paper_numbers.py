"""The paper's numbers, as data, each with the table or figure of the paper it comes from. The reproduction report
(reproduce_report.py) sets this run's figures beside them and reproduce_claims.py judges each claim.

Only the figures this repository holds are numbers here: the LoRA-A indicator table of Qwen3-8B (as the request for
the reproduction quoted it; docs/design.md §2 gives the same to three digits). The paper's other results are claims
in words: the figures of its ID/OOD table for seven methods on three models, its λ figure and its label-sensitivity
table are not in this repository, so the report shows this run's numbers beside the paper's statement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IndicatorRow:
    """One method's row of the paper's indicator table."""

    lora_a_mean: float  # LoRA-A AUROC, mean over sites
    lora_a_std: float  # its standard deviation over sites
    ood_factuality: float  # the merged model's OOD factuality


INDICATOR_MODEL = "Qwen3-8B"
INDICATOR_SOURCE = "the paper's table of LoRA-A separability against OOD factuality (Qwen3-8B)"
INDICATOR: dict[str, IndicatorRow] = {  # by method name (training/methods/)
    "sopl": IndicatorRow(0.6064, 0.0648, 0.8434),
    "dpo": IndicatorRow(0.6026, 0.0587, 0.8468),
    "sft": IndicatorRow(0.6272, 0.0666, 0.8530),
    "topl": IndicatorRow(0.7541, 0.1573, 0.8706),
}
INDICATOR_STATEMENT = "methods with stronger separability tend to generalize better"

FACTUALITY_SOURCE = "the paper's ID / OOD factuality table (seven methods, three models)"
LAMBDA_SOURCE = "the paper's figure of factuality against λ (LoRA-B steering)"
LAMBDA_STATEMENT = "TOPL's factuality rises then falls as λ goes from negative to positive; SFT's curve stays flat"
LABEL_SOURCE = "the paper's label-sensitivity table (seven label settings with their token counts)"
LAYER_SOURCE = "the paper's layer sweep (middle layers help most; adding the final layers helps little or hurts)"
