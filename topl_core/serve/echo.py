"""A prompt's own tokens scored by the forward that ran it (an echo, what lm-eval's multiple-choice requests read):
per position the log-probability of its token, its top alternatives, the head's p(good)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PromptScores:
    """A prompt's own tokens read by the forward that ran it (an echo): per position k ≥ 1, the log-probability of
    token k after the tokens before it (under the generating model: steered where the mode steers the prompt), its
    `top` alternatives as (token id, log-probability), and the head's p(good) of every position (the merged model's
    states, as for generated tokens; NaN without a head)."""

    logprob: list[float]
    top: list[list[tuple[int, float]]]
    p_good: list[float]


def prompt_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prompt forward's KV cache as each layer's (keys, values), 1 × heads × positions × head size."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def prompt_scores(ids: torch.Tensor, logits: torch.Tensor, top: int, p_good: torch.Tensor) -> PromptScores:
    """PromptScores of the prompt `ids` (positions) from its forward's `logits` (positions × vocabulary), a chunk of
    positions at a time (a long prompt's log-softmax over the vocabulary would double the logits' memory)."""
    logprob: list[float] = []
    alternatives: list[list[tuple[int, float]]] = []
    for start in range(0, ids.shape[0] - 1, 256):
        lsm = torch.log_softmax(logits[start : start + 256].float(), -1)[: ids.shape[0] - 1 - start]
        logprob += lsm.gather(1, ids[start + 1 : start + 1 + lsm.shape[0], None].to(lsm.device))[:, 0].tolist()
        if top:
            values, indices = lsm.topk(top, -1)
            alternatives += [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        else:
            alternatives += [[] for _ in range(lsm.shape[0])]
    p = p_good[0].tolist() if p_good.dim() == 2 else [float("nan")] * ids.shape[0]
    return PromptScores(logprob, alternatives, p)
