"""Merge a run's LoRA into its base model (the head is dropped: generation uses the original LM head) and
generate responses for one or many documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from .adapters import load_adapter
from .data.encode import build_prompt, truncate_document
from .models import LoadedModel, ModelSpec, load_model
from .precision import PRECISIONS, Precision, autocast


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 96
    mode: Literal["greedy", "sample"] = "greedy"
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0
    max_doc_tokens: int | None = 512
    batch_size: int = 4
    # compute precision of the forward passes (bf16 = autocast); "auto" resolves for the model's device when it
    # generates: callers that key a cache by this config resolve it first (EvalConfig does)
    precision: Precision = "auto"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r}: choose one of {PRECISIONS} ('auto' follows the hardware).")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be at least 1.")
        if self.mode not in ("greedy", "sample"):
            raise ValueError(f"mode={self.mode!r}: choose 'greedy' or 'sample'.")
        if self.mode == "sample" and not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature}: sampling needs a positive temperature.")


def load_merged(spec: ModelSpec | str, adapter) -> LoadedModel:
    """A fresh base model with the adapter's LoRA merged in (or the plain base model when adapter is None);
    `adapter`: anything open_adapter opens."""
    lm = load_model(spec)
    if adapter is not None:
        lm.model = load_adapter(lm, adapter, merge=True)
    return lm


@torch.no_grad()
def generate(
    lm: LoadedModel,
    documents: Sequence[str],
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
) -> list[str]:
    """Generate one response per document (left-padded batches; stops at end-of-turn). A translation's lang_pair
    ("en-de") names the languages in the prompt."""
    tok, model = lm.tokenizer, lm.model
    prompts = [build_prompt(tok, truncate_document(tok, d, cfg.max_doc_tokens), task, lang_pair) for d in documents]
    outputs: list[str] = []
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        for i in range(0, len(prompts), cfg.batch_size):
            enc = tok(prompts[i : i + cfg.batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            if cfg.mode == "sample":
                torch.manual_seed(cfg.seed + i)
            with autocast(cfg.precision, model.device.type):
                out = model.generate(
                    **enc,
                    max_new_tokens=cfg.max_new_tokens,
                    do_sample=cfg.mode == "sample",
                    temperature=cfg.temperature if cfg.mode == "sample" else None,
                    top_p=cfg.top_p if cfg.mode == "sample" else None,
                    top_k=None,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                )
            new = out[:, enc["input_ids"].shape[1] :]
            outputs.extend(t.strip() for t in tok.batch_decode(new, skip_special_tokens=True))
    finally:
        tok.padding_side = old_side
    return outputs
