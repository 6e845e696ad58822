"""What each method computes from the model on a batch: the forward helpers (head logits with the side probes, the
targets' log-probs, the reference policy), one loss step per method — (context, batch) → (loss, info) — and the
validators — (context, batches, precision, device) → metrics. The losses themselves are in losses.py."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from ..architecture import base_causal_lm, decoder_layers, final_norm
from ..data.encode import IGNORE, Batch
from ..forward import head_features, lm_head_logits
from ..metrics import auroc
from ..precision import autocast, to_numpy
from .losses import (
    dpo_loss,
    log_one_minus_p,
    nll_loss,
    pooled_response_logits,
    sequence_bce_loss,
    sequential_kl,
    tdpo_loss,
    token_bce_loss,
    unlikelihood_loss,
)

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
    targets = batch.lm_mask
    predictors = torch.zeros_like(targets)
    predictors[:, :-1] = targets[:, 1:]
    hidden = lm.model(**batch.forward_inputs(), use_cache=False).last_hidden_state
    logits = lm_head_logits(lm, hidden[predictors])
    logp = torch.log_softmax(logits, dim=-1)
    target_ids = batch.input_ids[targets]
    token_logp = logp.gather(-1, target_ids[:, None]).squeeze(-1)
    rows = targets.nonzero()[:, 0]
    return TargetLogprobs(
        token_logp,
        target_ids,
        rows,
        batch.labels[targets],
        batch.response_mask[targets],
        targets.shape[0],
        logp if vocab else None,
    )


@contextmanager
def reference_policy(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The reference policy: the same PEFT model with its adapter disabled, without gradients."""
    if not hasattr(model, "disable_adapter"):
        raise TypeError(f"the reference policy needs a PEFT model (disable_adapter); got {type(model).__name__}.")
    with torch.no_grad(), model.disable_adapter():
        yield model


# --- step functions: (context, batch) → (loss, info) ---------------------------------------------------------


def topl_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    logits, probes = head_and_probe_logits(ctx, batch)
    loss = token_bce_loss(logits, batch.labels)
    info: dict = {"supervised_tokens": batch.n_labelled}
    if probes:
        side = {k: token_bce_loss(p, batch.labels) for k, p in probes.items()}
        info |= {f"probe_loss_L{k}": float(v.detach()) for k, v in side.items()}
        total = sum(side.values())
        loss = loss + (total - total.detach())  # the value stays the head's loss; the gradient trains the probes too
    return loss, info


def sopl_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    logits = head_logits(ctx, batch)
    loss = sequence_bce_loss(logits, batch.response_mask, batch.sequence_labels)
    return loss, {"supervised_sequences": int(batch.sequence_labels.numel())}


def sft_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    lp = target_logprobs(ctx.model, batch)
    return nll_loss(lp.token_logp), {"supervised_tokens": batch.n_lm_targets}


def _unlikelihood_labels(lp: TargetLogprobs, batch: Batch) -> torch.Tensor:
    """Response tokens keep their labels; the end-of-turn token is good after a faithful response, else ignored."""
    eot = torch.where(batch.sequence_labels[lp.rows] == 1, 1, IGNORE)
    return torch.where(lp.is_response, lp.labels, eot)


def unlikelihood_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    lp = target_logprobs(ctx.model, batch, vocab=True)
    labels = _unlikelihood_labels(lp, batch)
    log1m_p = log_one_minus_p(lp.vocab_logp, lp.targets)
    good, bad = int((labels == 1).sum()), int((labels == 0).sum())
    return unlikelihood_loss(lp.token_logp, labels, log1m_p), {
        "good_tokens": good,
        "bad_tokens": bad,
        "supervised_tokens": good + bad,
    }


def _pair_halves(batch: Batch) -> int:
    n = batch.input_ids.shape[0]
    if n % 2 or not (
        bool((batch.sequence_labels[: n // 2] == 1).all()) and bool((batch.sequence_labels[n // 2 :] == 0).all())
    ):
        raise ValueError(
            "a pair batch needs chosen rows [0, B) labelled 1 and rejected rows [B, 2B) labelled 0 (collate_pairs)."
        )
    return n // 2


def _pair_info(ctx: StepContext, chosen_ratio: torch.Tensor, rejected_ratio: torch.Tensor) -> dict:
    """Implicit rewards r = β(log π_θ − log π_ref): accuracy = share of pairs with r_chosen > r_rejected."""
    margin = ctx.beta * (chosen_ratio - rejected_ratio).detach()
    return {
        "reward_accuracy": float((margin > 0).float().mean()),
        "reward_margin": float(margin.mean()),
        "pairs": int(margin.numel()),
    }


def dpo_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    B = _pair_halves(batch)
    pol = target_logprobs(ctx.model, batch)
    with reference_policy(ctx.model) as ref_model:
        ref = target_logprobs(ref_model, batch)
    pol_seq, ref_seq = pol.per_sequence(pol.token_logp), ref.per_sequence(ref.token_logp)
    loss = dpo_loss(pol_seq[:B], pol_seq[B:], ref_seq[:B], ref_seq[B:], ctx.beta)
    ratio = pol_seq - ref_seq
    return loss, _pair_info(ctx, ratio[:B], ratio[B:])


def tdpo_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    B = _pair_halves(batch)
    pol = target_logprobs(ctx.model, batch, vocab=True)
    with reference_policy(ctx.model) as ref_model:
        ref = target_logprobs(ref_model, batch, vocab=True)
    margin = pol.per_sequence(pol.token_logp - ref.token_logp)
    kl = pol.per_sequence(sequential_kl(ref.vocab_logp, pol.vocab_logp))
    loss = tdpo_loss(margin[:B], margin[B:], kl[:B], kl[B:], ctx.beta, ctx.tdpo_alpha, "tdpo2")
    return loss, {
        **_pair_info(ctx, margin[:B], margin[B:]),
        "seq_kl_chosen": float(kl[:B].detach().mean()),
        "seq_kl_rejected": float(kl[B:].detach().mean()),
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


@torch.no_grad()
def validate_sopl(ctx: StepContext, batches, precision: str, device: str) -> dict:
    """Validation loss, sequence AUROC of the pooled head logit (faithful positive), and the token AUROC of the
    same head where token labels are known (does a sequence-level head localise errors?)."""
    ctx.model.eval()
    losses, pooled, seq = [], [], []
    for b in batches:
        b = b.to(device)
        with autocast(precision, device):
            logits = head_logits(ctx, b)
        losses.append(float(sequence_bce_loss(logits, b.response_mask, b.sequence_labels)) * len(b.sequence_labels))
        pooled.append(to_numpy(pooled_response_logits(logits, b.response_mask)))
        seq.append(to_numpy(b.sequence_labels))
    y = np.concatenate(seq)
    out = {"val_loss": sum(losses) / max(len(y), 1), "val_seq_auroc": auroc(y, np.concatenate(pooled))}
    if any(bool((b.labels != IGNORE).any()) for b in batches):  # token labels known for some validation records
        out.update(validate_head(ctx, batches, precision, device))
    return out


@torch.no_grad()
def validate_unlikelihood(ctx: StepContext, batches, precision: str, device: str) -> dict:
    """Validation loss and the token AUROC of the policy's own log p(token) (good positive) on labelled tokens."""
    ctx.model.eval()
    total, n, scores, labels = 0.0, 0, [], []
    for b in batches:
        b = b.to(device)
        with autocast(precision, device):
            lp = target_logprobs(ctx.model, b, vocab=True)
        lab = _unlikelihood_labels(lp, b)
        k = int((lab != IGNORE).sum())
        total += float(unlikelihood_loss(lp.token_logp, lab, log_one_minus_p(lp.vocab_logp, lp.targets))) * k
        n += k
        keep = lp.is_response & (lp.labels != IGNORE)
        scores.append(to_numpy(lp.token_logp[keep]))
        labels.append(to_numpy(lp.labels[keep]))
    s, y = np.concatenate(scores), np.concatenate(labels)
    return {"val_loss": total / max(n, 1), "val_token_auroc_logp": auroc(y, s), "val_tokens": int(len(y))}
