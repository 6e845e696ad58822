"""The pure losses of the training methods: tensors in, a scalar out (no model, no batch). The methods that use them
are described in objectives.py; steps.py computes their inputs from a model and a batch."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from ..data.encode import IGNORE


def token_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of per-token head logits against labels 1 (good) / 0 (bad); -1 ignored (0 when no
    token is labelled). On a CPU, the mean over the labelled tokens indexed by the mask; on a GPU, where indexing by
    a mask makes the host wait while the device counts them, the same mean as a masked sum (`masked_token_bce_loss`;
    equal up to rounding, and a CPU run keeps the float bits of earlier versions)."""
    if logits.device.type != "cpu":
        return masked_token_bce_loss(logits, labels)
    mask = labels != IGNORE
    if not mask.any():
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[mask].float(), labels[mask].float())


def masked_token_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """token_bce_loss without indexing: every token's BCE, the unlabelled ones weighted 0, over the labelled count."""
    mask = labels != IGNORE
    per_token = F.binary_cross_entropy_with_logits(logits.float(), labels.clamp(min=0).float(), reduction="none")
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def pooled_response_logits(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """SOPL pooling: the mean of the per-token head logits (B, T) over each row's response tokens → (B,)."""
    m = response_mask.to(logits.dtype)
    return (logits * m).sum(-1) / m.sum(-1).clamp(min=1)


def sequence_bce_loss(logits: torch.Tensor, response_mask: torch.Tensor, sequence_labels: torch.Tensor) -> torch.Tensor:
    """SOPL: mean over rows of BCE(pooled_response_logits, sequence label 1 faithful / 0 unfaithful)."""
    pooled = pooled_response_logits(logits.float(), response_mask)
    return F.binary_cross_entropy_with_logits(pooled, sequence_labels.float())


def nll_loss(token_logp: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """SFT: mean of −log p(target) over the targets selected by mask (all when mask is None)."""
    if mask is not None:
        token_logp = token_logp[mask]
    if token_logp.numel() == 0:
        return token_logp.sum() * 0.0
    return -token_logp.mean()


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
    n = int(good.sum() + bad.sum())
    if n == 0:
        return token_logp.sum() * 0.0
    not_p = log1m_p[bad] if log1m_p is not None else log1m_exp(token_logp[bad])
    return (-(token_logp[good]).sum() - not_p.sum()) / n


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """DPO (Rafailov et al. 2023): mean of −log σ(β[(π_c − ref_c) − (π_r − ref_r)]) over pairs; inputs are
    per-sequence summed log-probs (B,)."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def sequential_kl(ref_logp: torch.Tensor, policy_logp: torch.Tensor) -> torch.Tensor:
    """Per-position KL(π_ref ‖ π_θ) = Σ_v p_ref(v)(log p_ref(v) − log p_θ(v)) from log-probabilities over the vocab
    (last dimension). Summing it over a response's positions gives TDPO's sequential KL D_SeqKL(x, y; π_ref ‖ π_θ)."""
    return (ref_logp.exp() * (ref_logp - policy_logp)).sum(-1)


def tdpo_loss(
    chosen_margin: torch.Tensor,
    rejected_margin: torch.Tensor,
    chosen_kl: torch.Tensor,
    rejected_kl: torch.Tensor,
    beta: float,
    alpha: float = 0.5,
    variant: Literal["tdpo1", "tdpo2"] = "tdpo2",
) -> torch.Tensor:
    """TDPO (Zeng et al. 2024, "Token-level Direct Preference Optimization"), mean over pairs of
        TDPO1: −log σ(β[(m_w − m_l) − (K_l − K_w)])
        TDPO2: −log σ(β[(m_w − m_l) − α(K_l − sg(K_w))])
    where m = Σ_t log π_θ(y_t) − log π_ref(y_t) (per-sequence log-ratio) and K = sequential KL(π_ref ‖ π_θ) of the
    chosen (w) / rejected (l) response; sg = stop-gradient. All inputs are (B,)."""
    if variant == "tdpo1":
        delta = rejected_kl - chosen_kl
    elif variant == "tdpo2":
        delta = alpha * (rejected_kl - chosen_kl.detach())
    else:
        raise ValueError(f"variant={variant!r}: choose 'tdpo1' or 'tdpo2'.")
    return -F.logsigmoid(beta * ((chosen_margin - rejected_margin) - delta)).mean()
