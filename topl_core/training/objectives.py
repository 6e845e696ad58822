"""Training objectives: small pure loss functions plus a registry that the one training loop drives.

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

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..architecture import base_causal_lm, decoder_layers, final_norm
from ..data.encode import IGNORE, Batch, Encoded, EncodedPair, collate, collate_pairs, encode_record
from ..data.records import Record
from ..errors import DataError
from ..forward import head_features, lm_head_logits
from ..metrics import auroc
from ..precision import autocast, to_numpy
from .config import METHOD_DATA, Requirement

# --- pure losses: tensors in, scalar out ------------------------------------------------------------------


def token_bce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of per-token head logits against labels 1 (good) / 0 (bad); -1 ignored."""
    mask = labels != IGNORE
    if not mask.any():
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[mask].float(), labels[mask].float())


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
        h = head_features(ctx.model, batch.input_ids, batch.attention_mask, ctx.head_layer)
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
    hidden = lm.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
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
    info: dict = {"supervised_tokens": int((batch.labels != IGNORE).sum())}
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
    return nll_loss(lp.token_logp), {"supervised_tokens": int(lp.token_logp.numel())}


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


# --- data preparation ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeSettings:
    max_doc_tokens: int
    max_response_tokens: int


def encode_token_labelled(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    """Every record whose token labels are known, encoded with per-token labels."""
    return [
        encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens)
        for r in records
        if r.token_labels_known
    ]


def encode_all(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    """Every record (token labels where known, -1 elsewhere); its sequence label is what SOPL trains on."""
    return [encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens) for r in records]


def faithful_records(records: Sequence[Record]) -> list[Record]:
    """The faithful responses: records with sequence_label 1, plus the faithful_response of an unfaithful record
    whose document has no faithful record with that same text (each faithful text once per document)."""
    out, seen = [], set()
    for r in records:
        if r.sequence_label == 1 and (r.doc_id, r.response) not in seen:
            seen.add((r.doc_id, r.response))
            out.append(r)
    for r in records:
        if r.sequence_label == 0 and r.faithful_response and (r.doc_id, r.faithful_response) not in seen:
            seen.add((r.doc_id, r.faithful_response))
            out.append(_chosen_record(r))
    return out


def _chosen_record(r: Record) -> Record:
    return dataclasses.replace(
        r,
        id=f"{r.id}:faithful",
        response=r.faithful_response,
        bad_spans=(),
        token_labels_known=True,
        sequence_label=1,
        faithful_response=None,
        meta={},
    )


def encode_faithful(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[Encoded]:
    return [encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens) for r in faithful_records(records)]


def encode_pairs(tokenizer, records: Sequence[Record], enc: EncodeSettings) -> list[EncodedPair]:
    """(chosen, rejected) for every unfaithful record with a faithful_response: the same document and prompt,
    chosen = faithful_response, rejected = the record's (perturbed or hallucinated) response."""
    return [
        EncodedPair(
            encode_record(tokenizer, _chosen_record(r), enc.max_doc_tokens, enc.max_response_tokens),
            encode_record(tokenizer, r, enc.max_doc_tokens, enc.max_response_tokens),
        )
        for r in records
        if r.sequence_label == 0 and r.faithful_response
    ]


def length_buckets(items: Sequence, size: int) -> list[list]:
    """Items sorted by length, then chunked by `size`: little padding and a few repeated shapes."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    return [[items[i] for i in order[k : k + size]] for k in range(0, len(order), size)]


def make_batches(examples: Sequence[Encoded], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-bucketed batches of `batch_size` examples."""
    return [collate(group, pad_id) for group in length_buckets(examples, batch_size)]


def make_pair_batches(pairs: Sequence[EncodedPair], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-bucketed pair batches of `batch_size` pairs (2 × batch_size rows: chosen, then rejected)."""
    return [collate_pairs(group, pad_id) for group in length_buckets(pairs, batch_size)]


# --- validation: (context, batches, precision, device) → metrics ---------------------------------------------


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


def _mean_loss_and_info(step, keys: tuple[str, ...]):
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


# --- the registry -------------------------------------------------------------------------------------------


Validator = Callable[[StepContext, list, str, str], dict]


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
        validate=_mean_loss_and_info(sft_loss_step, ()),
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
        validate=_mean_loss_and_info(dpo_loss_step, ("reward_accuracy", "reward_margin")),
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
        validate=_mean_loss_and_info(tdpo_loss_step, ("reward_accuracy", "reward_margin")),
        validation_metric="val_reward_accuracy",
        units_key="pairs",
    ),
}
