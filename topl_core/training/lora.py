"""LoRA on a model for training: PEFT's LoRA with a faster dropout of the same distribution (FastDropout), whose
masks a decoder layer draws for all its LoRA modules at once (LayerMasks)."""

from __future__ import annotations

import math

import torch

from ..models.architecture import decoder_layers
from .config import TrainConfig


def _kept_slices(words: int, p: float, device: torch.device | str) -> torch.Tensor:
    """[words, 4] booleans: the four 16-bit slices of `words` random 64-bit words, each uniform on [−32768, 32767],
    compared with p's threshold (True with probability 1 − p, exact to 1/65536). The top slice holds only 15 random
    bits: keep_masks drops it."""
    drawn = torch.empty(words, dtype=torch.int64, device=device).random_()
    return drawn.view(torch.int16).view(-1, 4) >= round(p * 65536) - 32768


@torch.library.custom_op(
    "topl::kept_slices",
    mutates_args=(),
    schema="(SymInt words, float p, Device device) -> Tensor",
    tags=(torch.Tag.nondeterministic_seeded,),
)
def _kept_slices_op(words: int, p: float, device: torch.device) -> torch.Tensor:
    """_kept_slices as one opaque operator for torch.compile (the same bits): its in-place draw (random_) would split
    a compiled decoder layer's graph in two."""
    return _kept_slices(words, p, device)


@_kept_slices_op.register_fake
def _(words: int, p: float, device: torch.device) -> torch.Tensor:
    return torch.empty((words, 4), dtype=torch.bool, device=device)


def keep_masks(shapes: list[torch.Size], p: float, device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """A boolean mask of each shape, each entry True with probability 1 − p (exact to 1/65536), independent: cut from
    the three low 16-bit slices of 64-bit random words, from one draw of random words for them all. Each mask takes
    its own whole words, in order, so on the CPU's generator (which draws words one after another) the masks are
    those each would draw alone in turn: a run trains as it did when each LoRA module drew its own mask (the demo
    adapters' rebuild, scripts/demo_adapters.py)."""
    sizes = [math.prod(shape) for shape in shapes]
    words = [(n + 2) // 3 for n in sizes]
    draw = _kept_slices_op if torch.compiler.is_compiling() else _kept_slices
    kept = draw(sum(words), p, device)
    return [part[:, :3].reshape(-1)[:n].view(shape) for part, n, shape in zip(kept.split(words), sizes, shapes)]


def keep_mask(shape: torch.Size, p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """keep_masks of one shape."""
    return keep_masks([shape], p, device)[0]


@torch.compiler.disable
def _own_mask(shape: torch.Size, p: float, device: torch.device) -> torch.Tensor:
    """A FastDropout's own mask, drawn eagerly even in compiled code (a graph break): the compiler would merge two
    topl::kept_slices of equal size in one graph into one draw, sharing a mask. A layer's LayerMasks draw once."""
    return keep_mask(shape, p, device)


class FastDropout(torch.nn.Module):
    """Inverted dropout, as nn.Dropout, with one random draw per three elements. Every LoRA module drops out its
    input (7 per layer), and nn.Dropout's masks were a large share of a CPU step (docs/performance.md, "What changed
    to get here"). In a decoder layer its mask is `drawn` for it by the layer's LayerMasks and used once; a
    FastDropout called alone, or on an input of another shape, draws its own."""

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)
        self.drawn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if self.p >= 1:
            return torch.zeros_like(x)
        keep, self.drawn = self.drawn, None  # autograd keeps what backward needs
        if keep is None or keep.shape != x.shape:
            keep = _own_mask(x.shape, self.p, x.device)
        return torch.where(keep, x * (1 / (1 - self.p)), 0)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerMasks:
    """The masks of one decoder layer's LoRA dropouts (7 modules), drawn together as the layer starts and handed to
    each FastDropout: one random draw and one comparison a layer instead of one a module. On a GPU each of those was
    a kernel the host launched while the GPU waited (docs/scale.md, "The third H200 session"). Every module still gets
    its own independent mask.

    The draw is a forward pre-hook on the layer's first operation, its input norm: inside the layer's forward, so a
    layer that recomputes its activations in backward (gradient checkpointing: transformers checkpoints the forward,
    not the layer's own hooks) draws the same masks again from the random state the checkpoint restores, and a
    compiled layer draws them in its graph as one operator (topl::kept_slices), the eager bits. The masks are cut in
    the order of the layer's modules, which is the order it calls them (q, k, v, o, gate, up, down): on the CPU, the
    masks the modules drew one by one before (keep_masks)."""

    def __init__(self, dropouts: list[tuple[FastDropout, int]]):
        self.dropouts = dropouts  # each with its input's width (the LoRA module's in_features), in call order
        self.p = dropouts[0][0].p
        if any(d.p != self.p for d, _ in dropouts):
            raise ValueError("a layer's LoRA dropouts draw their masks together: they need the same p")

    def draw(self, norm: torch.nn.Module, args: tuple) -> None:
        """Every dropout's mask for this call's rows (the layer's input without its width)."""
        if not (norm.training and 0 < self.p < 1):
            return
        rows = args[0].shape[:-1]
        shapes = [torch.Size([*rows, width]) for _, width in self.dropouts]
        for (dropout, _), mask in zip(self.dropouts, keep_masks(shapes, self.p, args[0].device)):
            dropout.drawn = mask

    @classmethod
    def attach(cls, layer: torch.nn.Module) -> LayerMasks | None:
        """The hook drawing the masks of `layer`'s FastDropouts, when it has any."""
        from peft.tuners.lora import LoraLayer

        dropouts = [
            (dropout, module.in_features)
            for module in layer.modules()
            if isinstance(module, LoraLayer)
            for dropout in module.lora_dropout.values()
            if isinstance(dropout, FastDropout)
        ]
        if not dropouts:
            return None
        masks = cls(dropouts)
        layer.input_layernorm.register_forward_pre_hook(masks.draw)
        return masks


def apply_lora(model: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """Wrap `model` in a PEFT LoRA model for cfg.lora; its LoRA dropouts are FastDropout (no parameters, so the
    saved adapter is the same as PEFT's own) with each decoder layer's masks drawn together (LayerMasks), and its
    LoRA modules take their input in the dtype it comes in (cast_lora_inputs(…, False): a training step runs under
    autocast, which casts for the matmul anyway)."""
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
                    dropouts[name] = FastDropout(d.p)
    for layer in decoder_layers(peft):
        LayerMasks.attach(layer)
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
