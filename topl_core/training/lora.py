"""LoRA on a model for training: PEFT's LoRA with a faster dropout of the same distribution (FastDropout)."""

from __future__ import annotations

import math

import torch

from .config import TrainConfig


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A boolean mask, each entry True with probability 1 − p (exact to 1/65536), independent. Cut from 16-bit
    slices of 64-bit random words, three per word (the top slice holds only 15 random bits and is dropped)."""
    n = math.prod(shape)
    words = torch.empty((n + 2) // 3, dtype=torch.int64, device=device).random_()
    slices = words.view(torch.int16).view(-1, 4)[:, :3].reshape(-1)[:n]  # uniform on [−32768, 32767]
    return (slices >= round(p * 65536) - 32768).view(shape)


@torch.library.custom_op(
    "topl::keep_mask",
    mutates_args=(),
    schema="(SymInt[] shape, float p, Device device, Tensor owner) -> Tensor",
    tags=(torch.Tag.nondeterministic_seeded,),
)
def _keep_mask_op(shape: list[int], p: float, device: torch.device, owner: torch.Tensor) -> torch.Tensor:
    """keep_mask as one opaque operator for torch.compile: its in-place draw (random_) would split a compiled decoder
    layer into a graph per LoRA module (7 a layer), each compiled and launched apart; the same bits as keep_mask.
    `owner` is the calling FastDropout's own empty tensor, unused here: the compiler merges calls with equal
    arguments (common-subexpression elimination knows torch's random operators, not this one), and the q, k and v
    modules draw for the same input, so without it they would share one mask."""
    return keep_mask(torch.Size(shape), p, device)


@_keep_mask_op.register_fake
def _(shape: list[int], p: float, device: torch.device, owner: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bool, device=device)


class FastDropout(torch.nn.Module):
    """Inverted dropout, as nn.Dropout, with one random draw per three elements. Every LoRA module draws a mask
    for its input (7 per layer), and nn.Dropout's masks were a large share of a CPU step (docs/performance.md,
    "What changed to get here")."""

    def __init__(self, p: float, device: torch.device | str = "cpu"):
        super().__init__()
        self.p = float(p)
        self.register_buffer("owner", torch.empty(0, device=device), persistent=False)  # see _keep_mask_op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.p >= 1:
            return torch.zeros_like(x)
        if torch.compiler.is_compiling():
            keep = _keep_mask_op(x.shape, self.p, x.device, self.owner)
        else:
            keep = keep_mask(x.shape, self.p, x.device)
        return torch.where(keep, x * (1 / (1 - self.p)), 0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def apply_lora(model: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """Wrap `model` in a PEFT LoRA model for cfg.lora; its LoRA dropouts are FastDropout (no parameters, so the
    saved adapter is the same as PEFT's own), and its LoRA modules take their input in the dtype it comes in
    (cast_lora_inputs(…, False): a training step runs under autocast, which casts for the matmul anyway)."""
    from peft import LoraConfig, get_peft_model

    lc = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.modules),
        layers_to_transform=cfg.for_depth(model.config.num_hidden_layers).lora.layers,  # a range left to the model
        task_type="CAUSAL_LM",
    )
    peft = get_peft_model(model, lc)
    for module in peft.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for name, d in dropouts.items():
                if isinstance(d, torch.nn.Dropout) and d.p > 0:
                    dropouts[name] = FastDropout(d.p, model.device)
    cast_lora_inputs(peft, False)
    return peft


def cast_lora_inputs(model: torch.nn.Module, enabled: bool) -> None:
    """Whether each LoRA module casts its input to its weights' dtype (PEFT's default, which a forward outside autocast
    with bf16 base and float32 LoRA weights needs). Under autocast the cast is a copy of every LoRA input in float32
    that the matmul casts straight back: bf16 → float32 → bf16 is exact, so leaving it out changes no value (on a GPU,
    those copies and casts were a tenth of a TOPL step's kernel time)."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.cast_input_dtype_enabled = enabled
