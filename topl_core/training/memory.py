"""Training memory computed without the memory: one micro-batch's forward and backward run on PyTorch's meta device
(shapes and dtypes, no data), with every tensor's storage counted while it lives. What the GPU then needs is

    weights (bf16) + trainable tensors (LoRA, head, probes: fp32 weights, gradients, AdamW's two moments)
    + the step's peak (activations saved for backward, plus the transients alive at the worst moment: the LM head's
      float32 logits of SFT-like methods, attention buffers, the backward's gradients in flight)

The step runs the method's own loss step (training/methods/) on the model built from its configuration (`transformers`
on meta, bf16), with LoRA injected as training does (lora.apply_lora) and, when asked, the decoder layers'
activation checkpointing (the recompute in backward is traced too). Three things differ from a CUDA run and are
stood in for: meta has no autocast (the LoRA weights and the head run in bf16 instead, as autocast computes them),
meta's attention is the math kernel (it is replaced by the memory-efficient kernel CUDA picks for a padded batch:
what it saves is what CUDA saves), and the CUDA allocator rounds every block up to 512 bytes (counted so here).
Not counted: the optimizer step's temporaries (LoRA-sized) and validation (no gradients: less than a training step).
Validated against peaks measured on an H100 (tests/test_memory.py).
"""

from __future__ import annotations

import copy
import functools
import math
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from ..data.encode import IGNORE, Batch
from ..foundations.errors import ConfigError
from ..models.loading import preset_model_config
from .config import TrainConfig, preset_config
from .lora import apply_lora
from .methods import METHODS
from .steps import StepContext

GIB = 2**30
CUDA_BLOCK = 512  # the CUDA caching allocator's allocation granularity
ADAMW_BYTES_PER_PARAM = 16  # fp32 weight, gradient, exp_avg, exp_avg_sq
META = torch.device("meta")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a training step needs on the GPU for micro-batches of `micro_batch_size` rows × `seq_len` tokens."""

    micro_batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    weights: int  # the frozen base model
    trainable: int  # LoRA, head and probes with their gradients and AdamW states (fp32)
    step: int  # the forward + backward's peak of live tensors above the weights

    @property
    def total(self) -> int:
        return self.weights + self.trainable + self.step

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB (weights {self.weights / GIB:.1f}, LoRA + optimizer "
            f"{self.trainable / GIB:.2f}, activations {self.step / GIB:.1f} for micro-batches of "
            f"{self.micro_batch_size} × {self.seq_len} tokens"
            f"{', gradient checkpointing' if self.gradient_checkpointing else ''})"
        )


# ops whose CPU index tensors stay on the CPU: a meta tensor indexed by a real mask gets the real selection's shape
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl_.default}


def _tensors(tree, found: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The tensors in an op's arguments or results (tuples, lists and dicts of them), in order. Not pytree's
    tree_flatten: it ran for every op of a traced step and took a fifth of the trace's time."""
    found = [] if found is None else found
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            _tensors(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            _tensors(item, found)
    return found


@functools.cache  # once per op, not per dispatch: a traced 8B step dispatches ~18,000
def _makes_new_storage(func) -> bool:
    """Whether an op's results are new storages (not views, not written in place): its schema's returns alias none
    of its arguments."""
    return all(r.alias_info is None for r in func._schema.returns)


def _is_batch_tensor(t: torch.Tensor) -> bool:
    """A tensor of the batch (real, on the CPU: masks and counts keep their values), not a scalar."""
    return t.is_cpu and t.dim() > 0


def _batch_to_meta(t: torch.Tensor) -> torch.Tensor:
    """A batch tensor meeting the model's meta tensors."""
    return t.to(META) if _is_batch_tensor(t) else t


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every storage an op creates on `device` while this mode is active, until the storage is
    freed (its Python object dies with it), and keeps the peak. Storages made before the mode (weights, inputs) are
    not counted, nor the views and in-place results of an op (their storage is an input's). On meta, the batch stays
    real on the CPU, so that what depends on its values (masks, selected positions, counts) is computed; where its
    tensors meet the model's they are moved to meta."""

    def __init__(self, device: torch.device = META) -> None:
        super().__init__()
        self.device = device
        self.live = 0
        self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            return False if args[0].dtype == torch.bool else 0  # a logged value (float(loss)): meta has no data
        tensors = _tensors((args, kwargs))
        if func not in _INDEXING and any(t.is_meta for t in tensors) and any(_is_batch_tensor(t) for t in tensors):
            args, kwargs = tree_map_only(torch.Tensor, _batch_to_meta, (args, kwargs))
        out = func(*args, **kwargs)
        if _makes_new_storage(func):
            for t in _tensors(out):
                if t.device == self.device:
                    self._count(t.untyped_storage())
        self.peak = max(self.peak, self.live)
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        ref = self._seen.get(key)
        if ref is not None and ref() is storage:
            return
        nbytes = math.ceil(storage.nbytes() / CUDA_BLOCK) * CUDA_BLOCK
        self.live += nbytes
        self._seen[key] = weakref.ref(storage, lambda _ref, n=nbytes, k=key: self._free(k, n, _ref))

    def _free(self, key: int, nbytes: int, ref: weakref.ref) -> None:
        self.live -= nbytes
        if self._seen.get(key) is ref:
            del self._seen[key]


def _efficient_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **_kwargs):
    """transformers' SDPA attention as CUDA runs it on a padded batch (a boolean mask rules out flash attention):
    the key/value heads repeated to the query heads, the mask made additive, then the memory-efficient kernel,
    which keeps its inputs, output and log-sum-exp for backward (meta alone would run the math kernel and keep the
    T × T attention weights)."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    bias = None
    if attention_mask is not None:
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout, False, scale=scaling
    )[0]
    return out.transpose(1, 2).contiguous(), None


def _padding_mask(batch_size: int, q_length: int, kv_length: int, device="cpu", **_kwargs) -> torch.Tensor:
    """The 4D boolean mask SDPA gets for a padded batch, one for all layers (its values are not needed on meta, and
    transformers' own mask builder would read the padding mask's values to decide whether one is needed)."""
    return torch.ones(batch_size, 1, q_length, kv_length, dtype=torch.bool, device=device)


def _register_meta_attention() -> str:
    """The stand-in attention (and its masks) registered with transformers under a name of its own; that name."""
    from transformers import AttentionInterface, AttentionMaskInterface

    name = "topl_meta_efficient"
    AttentionInterface.register(name, _efficient_attention)
    AttentionMaskInterface.register(name, _padding_mask)
    return name


def meta_causal_lm(model_config):
    """The causal LM of `model_config` (its text model) on the meta device in bf16, with the stand-in attention;
    `model_config` itself is left as it is (the trainer passes the config of the model it is about to train)."""
    from transformers import AutoModelForCausalLM

    attention = _register_meta_attention()
    text = copy.deepcopy(model_config.get_text_config())  # from_config sets the attention on the config it is given
    with torch.device(META):
        return AutoModelForCausalLM.from_config(text, dtype=torch.bfloat16, attn_implementation=attention)


def synthetic_batch(method: str, rows: int, seq_len: int, response_tokens: int) -> Batch:
    """A right-padded CPU batch of `rows` × `seq_len` (the last row one token shorter, so the model builds its padding
    mask as for real batches) whose last `response_tokens` positions of each row are a labelled response followed by
    the end-of-turn token; pair methods get chosen and rejected halves."""
    if seq_len < 2:
        raise ConfigError(f"seq_len={seq_len}: a training example needs at least 2 tokens.")
    response = max(1, min(response_tokens, seq_len - 2))
    start = seq_len - 1 - response
    attention = torch.ones(rows, seq_len, dtype=torch.long)
    attention[-1, -1] = 0
    labels = torch.full((rows, seq_len), IGNORE, dtype=torch.long)
    labels[:, start : start + response] = torch.arange(response) % 2
    response_mask = torch.zeros(rows, seq_len, dtype=torch.bool)
    response_mask[:, start : start + response] = True
    lm_mask = torch.zeros(rows, seq_len, dtype=torch.bool)
    lm_mask[:, start:] = attention[:, start:].bool()
    paired = METHODS[method].pairs
    sequence_labels = (torch.arange(rows) < rows // 2).long() if paired else torch.ones(rows, dtype=torch.long)
    return Batch(
        torch.zeros(rows, seq_len, dtype=torch.long),
        attention,
        labels,
        response_mask,
        sequence_labels,
        lm_mask,
        n_pairs=rows // 2 if paired else 0,
    )


def _bf16_linear(hidden: int, device: torch.device) -> torch.nn.Linear:
    return torch.nn.Linear(hidden, 1, device=device, dtype=torch.bfloat16)


def traced_step(cfg: TrainConfig, model, batch: Batch) -> tuple[int, int]:
    """Trace one micro-batch's loss and backward as the trainer runs them: (the peak bytes of live tensors on the
    model's device, the trainable parameters: LoRA, head and probes). `model` (a bf16 causal LM: meta_causal_lm, or a
    real one on the CPU to check the meta count against) receives LoRA here."""
    method = METHODS[cfg.method]
    device = next(model.parameters()).device
    cfg = cfg.for_depth(model.config.num_hidden_layers)
    peft = apply_lora(model, cfg)
    if cfg.gradient_checkpointing:
        peft.base_model.model.activation_checkpointing_enable({"use_reentrant": False})
    hidden = model.config.hidden_size
    head = _bf16_linear(hidden, device) if method.uses_head else None
    probes = torch.nn.ModuleDict({str(k): _bf16_linear(hidden, device) for k in cfg.probe_layers})
    trainable = [p for m in (peft, head, probes) if m is not None for p in m.parameters() if p.requires_grad]
    for p in trainable:  # in bf16 as autocast computes with them; their fp32 selves are counted apart
        p.data = p.data.to(torch.bfloat16)
        p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))  # fp32 gradients: counted apart
    head_layer = method.head_layer(cfg.lora.layer_end, model.config.num_hidden_layers)
    ctx = StepContext(peft, head, head_layer, cfg.beta, cfg.tdpo_alpha, probes or None)
    peft.train()
    with LiveBytes(device) as counter:
        loss, info = method.loss(ctx, batch)
        (loss * info[method.units_key]).backward()
        del loss
    return counter.peak, sum(p.numel() for p in trainable)


def estimate_training_memory(
    cfg: TrainConfig, model_config, seq_len: int, micro_batch_size: int | None = None
) -> MemoryEstimate:
    """What a training step of `cfg` needs on a GPU for micro-batches of `micro_batch_size` (default cfg's) rows of
    `seq_len` tokens, each with a response of cfg.max_response_tokens (the most a record is cut to) and its
    end-of-turn token: weights in bf16, LoRA in fp32 with AdamW, the step's peak traced on meta."""
    rows = micro_batch_size or cfg.micro_batch_size
    batch_rows = 2 * rows if METHODS[cfg.method].pairs else rows
    return estimate_batch_memory(
        cfg, model_config, synthetic_batch(cfg.method, batch_rows, seq_len, cfg.max_response_tokens)
    )


def estimate_batch_memory(cfg: TrainConfig, model_config, batch: Batch) -> MemoryEstimate:
    """What a training step of `cfg` needs on a GPU for micro-batches like `batch` (a real one, on the CPU)."""
    model = meta_causal_lm(model_config)
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    step, trainable = traced_step(cfg, model, batch)
    rows, seq_len = batch.input_ids.shape
    if METHODS[cfg.method].pairs:
        rows //= 2  # a micro-batch of pairs holds chosen and rejected rows
    return MemoryEstimate(rows, seq_len, cfg.gradient_checkpointing, weights, trainable * ADAMW_BYTES_PER_PARAM, step)


def largest_fitting_micro_batch(
    cfg: TrainConfig, model_config, seq_len: int, budget_bytes: int, cap: int = 1024
) -> int:
    """The largest micro-batch (up to `cap`) whose estimate at `seq_len` fits in `budget_bytes`; 0 when not even one
    row fits. The step's bytes grow about linearly with the rows: two estimates give the guess, more settle it."""
    totals: dict[int, int] = {}

    def fits(rows: int) -> bool:
        if rows not in totals:
            totals[rows] = estimate_training_memory(cfg, model_config, seq_len, rows).total
        return totals[rows] <= budget_bytes

    if not fits(1):
        return 0
    fits(2)
    per_row = max(totals[2] - totals[1], 1)
    rows = max(1, min(cap, 1 + (budget_bytes - totals[1]) // per_row))
    while rows < cap and fits(rows + 1):
        rows += 1
    while rows > 1 and not fits(rows):
        rows -= 1
    return rows


def longest_micro_batch(batches: list[list[Batch]]) -> Batch:
    """The micro-batch that needs the most memory: the most tokens (rows × length), then the most LM targets."""
    return max(
        (micro for batch in batches for micro in batch),
        key=lambda b: (b.input_ids.numel(), b.n_lm_targets),
    )


def check_fits(cfg: TrainConfig, model_config, batch: Batch, free_bytes: int) -> MemoryEstimate:
    """Refuse a run whose step on micro-batches like `batch` (the longest) would not fit: `free_bytes` is what the
    device has free with the base model's weights already on it (the CUDA caller passes torch.cuda.mem_get_info's
    first value at the start of training). Returns the estimate."""
    cfg = cfg.for_depth(model_config.num_hidden_layers)
    estimate = estimate_batch_memory(cfg, model_config, batch)
    needed = estimate.trainable + estimate.step
    if needed <= free_bytes:
        return estimate
    fixes = []
    rows = largest_fitting_micro_batch(cfg, model_config, estimate.seq_len, estimate.weights + free_bytes)
    if 0 < rows < cfg.micro_batch_size:
        fixes.append(f"--micro-batch-size {rows} (the largest that fits; the batch stays {cfg.batch_size})")
    if not cfg.gradient_checkpointing:
        fixes.append("--gradient-checkpointing (recomputes each layer's activations in backward)")
    fixes.append(f"fewer LoRA layers (now {cfg.lora.layer_start}-{cfg.lora.layer_end})")
    fixes.append(
        f"shorter inputs (--max-doc-tokens {cfg.max_doc_tokens}, --max-response-tokens {cfg.max_response_tokens})"
    )
    raise ConfigError(
        f"micro_batch_size={cfg.micro_batch_size}: a training step on the longest micro-batch "
        f"({estimate.micro_batch_size} × {estimate.seq_len} tokens) needs about {needed / GIB:.1f} GiB beyond the "
        f"model's weights, but the GPU has {free_bytes / GIB:.1f} GiB free (estimate: {estimate.describe()}). "
        f"Use {'; or '.join(fixes)}."
    )


@dataclass(frozen=True)
class FitRow:
    """The largest micro-batch of a preset's method that fits a budget at one sequence length."""

    preset: str
    method: str
    seq_len: int
    gradient_checkpointing: bool
    micro_batch_size: int  # 0: not even one row fits
    total_gib: float  # the estimate at that micro-batch (0 when none fits)


def what_fits(
    budget_bytes: int, seq_lens: tuple[int, ...], presets: tuple[str, ...], methods: tuple[str, ...]
) -> list[FitRow]:
    """For each preset × method × sequence length × gradient checkpointing off / on: the largest micro-batch whose
    estimate fits in `budget_bytes` (the paper's LoRA layers, responses of max_response_tokens)."""
    rows = []
    for preset in presets:
        model_config = preset_model_config(preset)
        for method in methods:
            for seq_len in seq_lens:
                for checkpointing in (False, True):
                    cfg = preset_config(preset, method, gradient_checkpointing=checkpointing, precision="bf16")
                    fitting = largest_fitting_micro_batch(cfg, model_config, seq_len, budget_bytes)
                    total = estimate_training_memory(cfg, model_config, seq_len, fitting).total if fitting else 0
                    rows.append(FitRow(preset, method, seq_len, checkpointing, fitting, total / GIB))
    return rows
