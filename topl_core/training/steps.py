"""What the methods' loss steps — (context, batch) → (loss, info) — and validators — (context, batches, precision,
device) → metrics — share: the step context, the forward helpers (head logits with the side probes, the targets'
log-probs, the reference policy), the (chosen, rejected) pair helpers of the preference methods, and the validators
that several methods use. Each method's own loss, step and validator are in its module of training/methods/."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from ..data.encode import IGNORE, Batch
from ..foundations.metrics import auroc
from ..hardware.precision import autocast, to_numpy
from ..models.architecture import base_causal_lm, decoder_layers, final_norm
from ..models.forward import head_features, lm_head_logits

# --- forward helpers ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepContext:
    """What a loss step may use: the PEFT model, the head (or None), the head layer m, and method constants."""

    model: torch.nn.Module
    head: torch.nn.Module | None
    head_layer: int | None
    beta: float
    tdpo_alpha: float = 0.5
    probes: torch.nn.ModuleDict | None = None  # {"k": linear probe on FinalNorm(layer k)}, k below the head layer


def head_logits(ctx: StepContext, batch: Batch) -> torch.Tensor:
    """Per-token head logits (B, T) in float32: h(FinalNorm(f_{0:m}(x)))."""
    return head_and_probe_logits(ctx, batch)[0]


def head_and_probe_logits(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The head's logits and, from the same forward, each side probe's: probe_k(FinalNorm(layer k's output)), the
    output detached so that the probes learn from the model without teaching it."""
    captured: dict[int, torch.Tensor] = {}

    def keep(k: int):
        def hook(_module, _inputs, output):
            captured[k] = output[0] if isinstance(output, tuple) else output

        return hook

    layers = decoder_layers(ctx.model)
    hooks = [layers[int(k)].register_forward_hook(keep(int(k))) for k in (ctx.probes or {})]
    try:
        h = head_features(ctx.model, layer=ctx.head_layer, **batch.forward_inputs())
    finally:
        for handle in hooks:
            handle.remove()
    norm = final_norm(ctx.model)
    probes = {k: ctx.probes[str(k)](norm(x.detach())).squeeze(-1).float() for k, x in sorted(captured.items())}
    return ctx.head(h).squeeze(-1).float(), probes


@dataclass
class TargetLogprobs:
    """Next-token log-probabilities of the targets in `batch.lm_mask`, flattened in row-major order (N targets)."""

    token_logp: torch.Tensor  # (N,) log p(target token), float32
    targets: torch.Tensor  # (N,) target token ids
    rows: torch.Tensor  # (N,) batch row of each target
    labels: torch.Tensor  # (N,) token label 1/0/-1 of each target (-1 for the end-of-turn token)
    is_response: torch.Tensor  # (N,) bool: a response token (False: the end-of-turn token)
    n_rows: int
    vocab_logp: torch.Tensor | None = None  # (N, V) log-softmax over the vocabulary, when asked for

    def per_sequence(self, values: torch.Tensor) -> torch.Tensor:
        """Sum per-target values (N,) into per-row totals (n_rows,)."""
        return torch.zeros(self.n_rows, dtype=values.dtype, device=values.device).index_add(0, self.rows, values)


def target_logprobs(model: torch.nn.Module, batch: Batch, vocab: bool = False) -> TargetLogprobs:
    """Run the causal LM (PEFT adapter as currently enabled) and return log p of every lm_mask target.

    Only the predicting positions go through the LM head, so the (T × vocab) logits of prompt and document never
    exist; the LM head runs in float32 outside autocast (bf16 logits would quantise log-probs to ~0.1 nats),
    followed by the model's final logit soft-capping when its config has one (Gemma)."""
    if batch.lm_mask is None:
        raise ValueError("this batch has no lm_mask; build it with topl_core.data.encode.collate.")
    lm = base_causal_lm(model)
    rows, columns = batch.lm_positions.unbind(1)  # gathered by index: no wait for the device (Batch.lm_positions)
    hidden = lm.model(**batch.forward_inputs(), use_cache=False).last_hidden_state
    logits = lm_head_logits(lm, hidden[rows, columns - 1])  # each target is predicted by the position before it
    logp = torch.log_softmax(logits, dim=-1)
    target_ids = batch.input_ids[rows, columns]
    token_logp = logp.gather(-1, target_ids[:, None]).squeeze(-1)
    return TargetLogprobs(
        token_logp,
        target_ids,
        rows,
        batch.labels[rows, columns],
        batch.response_mask[rows, columns],
        batch.lm_mask.shape[0],
        logp if vocab else None,
    )


@contextmanager
def reference_policy(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The reference policy: the same PEFT model with its adapter disabled, without gradients."""
    if not hasattr(model, "disable_adapter"):
        raise TypeError(f"the reference policy needs a PEFT model (disable_adapter); got {type(model).__name__}.")
    with torch.no_grad(), model.disable_adapter():
        yield model


# --- (chosen, rejected) pairs: DPO, TDPO ---------------------------------------------------------------------


def pair_halves(batch: Batch) -> int:
    """B, the number of pairs of a pair batch: chosen rows [0, B), rejected rows [B, 2B) (counted by collate_pairs,
    where the batch was built: reading its labels here would make a GPU's host wait)."""
    if not batch.n_pairs or batch.input_ids.shape[0] != 2 * batch.n_pairs:
        raise ValueError(
            "a pair batch holds chosen rows [0, B) and rejected rows [B, 2B): build it with collate_pairs."
        )
    return batch.n_pairs


def pair_info(ctx: StepContext, chosen_ratio: torch.Tensor, rejected_ratio: torch.Tensor) -> dict:
    """Implicit rewards r = β(log π_θ − log π_ref): accuracy = share of pairs with r_chosen > r_rejected. The rates
    stay on the device (the trainer reads a step's info back once, with its losses)."""
    margin = ctx.beta * (chosen_ratio - rejected_ratio).detach()
    return {
        "reward_accuracy": (margin > 0).float().mean(),
        "reward_margin": margin.mean(),
        "pairs": int(margin.numel()),
    }


# --- validation: (context, batches, precision, device) → metrics ---------------------------------------------

Validator = Callable[[StepContext, list, str, str], dict]


@torch.no_grad()
def validate_head(ctx: StepContext, batches, precision: str, device: str) -> dict:
    """Head token AUROC on validation tokens: positive = good, score = p(good)."""
    ctx.model.eval()
    scores: dict[str, list] = {}
    labels = []
    for b in batches:
        b = b.to(device)
        with autocast(precision, device):
            logits, probes = head_and_probe_logits(ctx, b)
        mask = b.labels != IGNORE
        for name, x in [("val_token_auroc", logits)] + [(f"val_token_auroc_L{k}", p) for k, p in probes.items()]:
            scores.setdefault(name, []).append(to_numpy(torch.sigmoid(x[mask])))
        labels.append(to_numpy(b.labels[mask]))
    y = np.concatenate(labels)
    return {
        **{name: auroc(y, np.concatenate(parts)) for name, parts in scores.items()},
        "val_tokens": int(len(y)),
        "val_bad_frac": float(1 - y.mean()) if len(y) else float("nan"),
    }


def mean_loss_validator(step, keys: tuple[str, ...]) -> Validator:
    """A validator: the objective's own loss (and the named info values) averaged over validation batches,
    weighted by batch rows."""

    @torch.no_grad()
    def validate(ctx: StepContext, batches, precision: str, device: str) -> dict:
        ctx.model.eval()
        total, n, sums = 0.0, 0, dict.fromkeys(keys, 0.0)
        for b in batches:
            b = b.to(device)
            with autocast(precision, device):
                loss, info = step(ctx, b)
            rows = int(b.input_ids.shape[0])
            total += float(loss) * rows
            n += rows
            for k in keys:
                sums[k] += float(info[k]) * rows
        return {"val_loss": total / max(n, 1), **{f"val_{k}": v / max(n, 1) for k, v in sums.items()}}

    return validate


def read_back(losses: list[torch.Tensor], infos: list[dict]) -> tuple[list[float], list[dict]]:
    """The micro-batches' losses and the values their infos left on the device, read in one transfer after the step's
    last backward (a read of each would make a GPU's host wait each time): integer tensors come back as ints
    (counts), the others as floats."""
    slots = [(i, k) for i, info in enumerate(infos) for k, v in info.items() if isinstance(v, torch.Tensor)]
    tensors = [x.detach().reshape(()).double() for x in losses]
    tensors += [infos[i][k].detach().reshape(()).double() for i, k in slots]  # float64: exact for any count
    values = torch.stack(tensors).tolist() if tensors else []
    read = [dict(info) for info in infos]
    for (i, k), v in zip(slots, values[len(losses) :]):
        read[i][k] = v if infos[i][k].is_floating_point() else int(v)
    return values[: len(losses)], read


def combine_micro_batches(
    losses: list[float], infos: list[dict], units_key: str, params: list[torch.nn.Parameter]
) -> tuple[float, dict]:
    """Turn the unit-weighted gradient sum into the step's mean (the gradient of the loss over all micro-batches
    at once) and merge the micro-batches' logs: counts add up, rates are unit-weighted means."""
    units = [info[units_key] for info in infos]
    total = sum(units)
    if total:
        for p in params:
            if p.grad is not None:
                p.grad.div_(total)
    weights = [u / total if total else 1 / len(units) for u in units]
    merged = {}
    for key in infos[0]:
        values = [info[key] for info in infos]
        merged[key] = sum(values) if isinstance(values[0], int) else float(sum(w * v for w, v in zip(weights, values)))
    return float(sum(w * x for w, x in zip(weights, losses))), merged
