"""Token-level unlikelihood: on token-labelled responses (faithful and perturbed), −log p(token) on good tokens and
−log(1 − p(token)) on bad tokens, averaged over supervised tokens; the end-of-turn token of a faithful response
counts as good, that of a perturbed response is not supervised."""

from __future__ import annotations

import numpy as np
import torch

from ...data.encode import IGNORE, Batch
from ...foundations.metrics import auroc
from ...foundations.presets import PRESETS, MethodHyper
from ...hardware.precision import autocast, to_numpy
from ..batching import encode_token_labelled
from ..steps import StepContext, TargetLogprobs, target_logprobs
from .base import Method


def log1m_exp(logp: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """log(1 − exp(logp)) for logp ≤ 0; p is capped at 1 − eps so the result stays finite. (The training step
    computes log(1 − p) exactly from the other tokens' probabilities instead: see `log_one_minus_p`.)"""
    return torch.log(-torch.expm1(logp.clamp(max=-eps)))


def log_one_minus_p(vocab_logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log(1 − p(target)) = logsumexp of the log-probs of every *other* token: exact, finite and with a gradient
    even when p(target) rounds to 1. vocab_logp (N, V), targets (N,) → (N,)."""
    return torch.logsumexp(vocab_logp.scatter(-1, targets[:, None], float("-inf")), dim=-1)


def unlikelihood_loss(
    token_logp: torch.Tensor, labels: torch.Tensor, log1m_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Token-level unlikelihood: mean over supervised targets of −log p (label 1, good) or −log(1 − p)
    (label 0, bad); label −1 is ignored. `token_logp` is log p(target token), same shape as labels; `log1m_p`,
    when given, is log(1 − p(target)) computed exactly (else it is derived from token_logp)."""
    good, bad = labels == 1, labels == 0
    not_p = log1m_p if log1m_p is not None else log1m_exp(token_logp)
    # masked sums over a count that stays on the device: indexing by the masks, or reading the count, would make a
    # GPU's host wait
    total = torch.where(good, token_logp, 0.0).sum() + torch.where(bad, not_p, 0.0).sum()
    return -total / (good.sum() + bad.sum()).clamp(min=1)


def _unlikelihood_labels(lp: TargetLogprobs, batch: Batch) -> torch.Tensor:
    """Response tokens keep their labels; the end-of-turn token is good after a faithful response, else ignored."""
    eot = torch.where(batch.sequence_labels[lp.rows] == 1, 1, IGNORE)
    return torch.where(lp.is_response, lp.labels, eot)


def unlikelihood_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    lp = target_logprobs(ctx.model, batch, vocab=True)
    labels = _unlikelihood_labels(lp, batch)
    log1m_p = log_one_minus_p(lp.vocab_logp, lp.targets)
    good, bad = (labels == 1).sum(), (labels == 0).sum()  # on the device, read back with the step's losses
    return unlikelihood_loss(lp.token_logp, labels, log1m_p), {
        "good_tokens": good,
        "bad_tokens": bad,
        "supervised_tokens": good + bad,
    }


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


METHOD = Method(
    name="unlikelihood",
    label="unlikelihood",
    description="Token-level unlikelihood: −log p on good tokens, −log(1 − p) on bad tokens of token-labelled "
    "responses.",
    requires="token_labels",
    loss=unlikelihood_loss_step,
    prepare=encode_token_labelled,
    validate=validate_unlikelihood,
    paper={preset: MethodHyper(1e-4, 4, 2) for preset in PRESETS},  # one setting for every model family
    validation_metric="val_token_auroc_logp",
)
