"""Fluency of generated texts, so that a steered summary that degenerates (repetition, letter soup) is reported as
damage instead of being scored "unfaithful".

    text_stats(text) -> Fluency
        text-only metrics over lower-cased word tokens (runs of \\w, an apostrophe inside a word kept): words,
        distinct_1 / distinct_2 (distinct n-grams / n-grams; 1.0 when the text has no n-gram of that size),
        repeated_3gram (fraction of the 3-grams that repeat an earlier 3-gram of the same text; 0.0 without
        3-grams), compression_ratio (UTF-8 bytes / zlib level-9 bytes; high = repetitive; 0.0 for ""), upper_case
        (fraction of the cased letters that are upper-case; 0.0 without any). No model: perplexity and
        tokens_per_word are NaN and `degenerate` is judged on the text-only criteria.
    perplexities(lm, texts, batch_size=8) -> list[float]
        lm: a models.loading.LoadedModel. Each text on its own (no prompt; the tokenizer's own special tokens),
        cut to its first MAX_PERPLEXITY_TOKENS tokens: exp(mean next-token NLL over its tokens). Right-padded
        batches (padded here, so the tokenizer is never changed) with the attention mask, torch.no_grad, eval
        mode (the model's training flag is restored in finally). NaN for a text with fewer than 2 tokens.
    tokens_per_word(tokenizer, texts) -> list[float]    tokens (no special tokens) / words; NaN without words
    fluency(texts, lm=None, batch_size=8, perplexity=None) -> list[Fluency]
        text_stats of every text plus, when lm is given, its perplexity (computed, or the `perplexity` given) and
        tokens_per_word; degenerate judged on all criteria.
    Fluency.to_json() -> dict          NaN written as None

A text is degenerate when any criterion below holds; `reason` names each that does, joined by "; ":
    no words                                                    "empty" ("no words" when it is not blank)
    repeated_3gram > MAX_REPEATED_3GRAM                         "repetitive: 45% of 3-grams repeat"
      or else compression_ratio > MAX_COMPRESSION_RATIO         "repetitive: compresses 4.1x"
    upper_case > MAX_UPPER_CASE (at least MIN_CASED_LETTERS),   "non-words: 79% of letters upper-case,
      tokens_per_word > MAX_TOKENS_PER_WORD (at least MIN_TOKENS)   3.0 tokens per word" (those that hold)
    perplexity > MAX_PERPLEXITY                                 "perplexity 2,400 under the base model"

Why tokens_per_word and upper_case: the per-token perplexity does not see letter soup. A non-word splits into
sub-word tokens that predict one another, so the soup of a far-steered model has the perplexity of real summaries;
letter soup is flagged by what a word costs in tokens (and, with no model, by its upper-case letters), perplexity
flags word salad made of real words. Each threshold below sits above what real summaries reach and below what
degenerate texts do: docs/evaluation.md §3, "The degenerate rule's thresholds", has the measurements.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import torch

from ...models.loading import LoadedModel

# the degenerate rule's thresholds (docs/evaluation.md §3, "The degenerate rule's thresholds")
MAX_REPEATED_3GRAM = 0.2
MAX_COMPRESSION_RATIO = 3.0
MAX_UPPER_CASE = 0.5
MIN_CASED_LETTERS = 40  # below this (a short "FBI and NSA" line) upper_case is not judged
MAX_TOKENS_PER_WORD = 2.5
MIN_TOKENS = 16  # tokens_per_word is not judged on texts of fewer tokens (a 12-word summary has about 16)
MAX_PERPLEXITY = 2000.0
MAX_PERPLEXITY_TOKENS = 256  # each text is cut to its first 256 tokens for perplexity (real summaries: at most 105)

_WORD = re.compile(r"\w+(?:['’]\w+)*")


@dataclass(frozen=True)
class Fluency:
    """Fluency metrics of one text (see the module docstring); NaN where not computed."""

    words: int
    distinct_1: float
    distinct_2: float
    repeated_3gram: float
    compression_ratio: float
    upper_case: float
    perplexity: float
    tokens_per_word: float
    degenerate: bool
    reason: str

    def to_json(self) -> dict:
        """A JSON-safe dict (NaN as None)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def words_of(text: str) -> list[str]:
    """Lower-cased word tokens of a text."""
    return _WORD.findall(text.lower())


def _ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(words: Sequence[str], n: int) -> float:
    """Distinct n-grams / n-grams; 1.0 when there is no n-gram."""
    grams = _ngrams(words, n)
    return len(set(grams)) / len(grams) if grams else 1.0


def repeated_ngrams(words: Sequence[str], n: int = 3) -> float:
    """Fraction of the n-grams that repeat an earlier n-gram; 0.0 when there is no n-gram."""
    grams = _ngrams(words, n)
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams) if grams else 0.0


def compression_ratio(text: str) -> float:
    """len(UTF-8 bytes) / len(zlib level-9 bytes); 0.0 for the empty text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data, 9)) if data else 0.0


def _upper_case(text: str) -> tuple[float, int]:
    cased = [c for c in text if c.isupper() or c.islower()]
    return (sum(c.isupper() for c in cased) / len(cased) if cased else 0.0), len(cased)


def _reasons(f: Fluency, text: str, tokens: int) -> list[str]:
    if f.words == 0:
        return ["empty" if not text.strip() else "no words"]
    out = []
    if f.repeated_3gram > MAX_REPEATED_3GRAM:
        out.append(f"repetitive: {f.repeated_3gram:.0%} of 3-grams repeat")
    elif f.compression_ratio > MAX_COMPRESSION_RATIO:
        out.append(f"repetitive: compresses {f.compression_ratio:.1f}x")
    non_words = []
    if f.upper_case > MAX_UPPER_CASE and _upper_case(text)[1] >= MIN_CASED_LETTERS:
        non_words.append(f"{f.upper_case:.0%} of letters upper-case")
    if f.tokens_per_word > MAX_TOKENS_PER_WORD and tokens >= MIN_TOKENS:  # NaN compares False
        non_words.append(f"{f.tokens_per_word:.1f} tokens per word")
    if non_words:
        out.append("non-words: " + ", ".join(non_words))
    if f.perplexity > MAX_PERPLEXITY:
        out.append(f"perplexity {f.perplexity:,.0f} under the base model")
    return out


def _judged(f: Fluency, text: str, tokens: int = 0) -> Fluency:
    reasons = _reasons(f, text, tokens)
    return replace(f, degenerate=bool(reasons), reason="; ".join(reasons))


def text_stats(text: str) -> Fluency:
    """Text-only fluency metrics (no model: perplexity and tokens_per_word NaN, degenerate judged on the
    text-only criteria)."""
    w = words_of(text)
    f = Fluency(
        words=len(w),
        distinct_1=distinct_n(w, 1),
        distinct_2=distinct_n(w, 2),
        repeated_3gram=repeated_ngrams(w, 3),
        compression_ratio=compression_ratio(text),
        upper_case=_upper_case(text)[0],
        perplexity=math.nan,
        tokens_per_word=math.nan,
        degenerate=False,
        reason="",
    )
    return _judged(f, text)


def _token_counts(tokenizer, texts: Sequence[str]) -> list[int]:
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def tokens_per_word(tokenizer, texts: Sequence[str]) -> list[float]:
    """Tokens of each text (no special tokens) per word of words_of; NaN for a text without words."""
    return [n / w if w else math.nan for n, w in zip(_token_counts(tokenizer, texts), map(len, map(words_of, texts)))]


def perplexities(lm: LoadedModel, texts: Sequence[str], batch_size: int = 8) -> list[float]:
    """The model's perplexity of each text on its own (first MAX_PERPLEXITY_TOKENS tokens), NaN below 2 tokens.
    Right-padded batches with the attention mask; neither the model nor the tokenizer is left changed."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be at least 1.")
    model, tok = lm.model, lm.tokenizer
    ids = [tok(t, truncation=True, max_length=MAX_PERPLEXITY_TOKENS)["input_ids"] for t in texts]
    out = [math.nan] * len(texts)
    todo = sorted((i for i, x in enumerate(ids) if len(x) >= 2), key=lambda i: len(ids[i]))  # similar lengths
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                width = max(len(ids[i]) for i in batch)
                input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, i in enumerate(batch):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                    mask[row, : len(ids[i])] = 1
                input_ids, mask = input_ids.to(device), mask.to(device)
                logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
                # NLL of token t+1 given tokens <= t, (batch, width - 1); padded targets masked out
                nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
                target = mask[:, 1:].float()
                mean_nll = (nll * target).sum(1) / target.sum(1)
                for row, i in enumerate(batch):
                    out[i] = math.exp(mean_nll[row].item())
    finally:
        model.train(was_training)
    return out


def fluency(
    texts: Sequence[str],
    lm: LoadedModel | None = None,
    batch_size: int = 8,
    perplexity: Sequence[float] | None = None,
) -> list[Fluency]:
    """text_stats of every text plus, when `lm` is given, its perplexity and tokens_per_word; degenerate judged
    on all criteria. `perplexity`: the texts' perplexities under `lm` when already known (e.g. cached)."""
    texts = list(texts)
    stats = [text_stats(t) for t in texts]
    if lm is None:
        return stats
    ppl = list(perplexity) if perplexity is not None else perplexities(lm, texts, batch_size)
    counts = _token_counts(lm.tokenizer, texts)
    return [
        _judged(replace(s, perplexity=p, tokens_per_word=n / s.words if s.words else math.nan), t, n)
        for s, p, n, t in zip(stats, ppl, counts, texts)
    ]
