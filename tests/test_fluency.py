"""Fluency metrics (topl_core.analysis.steering.fluency): text-only statistics on hand-made texts, perplexity on the
tiny model checked against a hand-computed forward pass, and the thresholds on the embedded SmolLM2."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from conftest import needs_smollm2

from topl_core.analysis.steering.fluency import (
    MAX_PERPLEXITY,
    Fluency,
    fluency,
    perplexities,
    text_stats,
    tokens_per_word,
)
from topl_core.models.loading import load_model

FLUENT = (
    "The Leeds council approved the new budget on Monday after a long debate. "
    "Police said two men were arrested in the city centre and later released without charge."
)
SENTENCE = "The council approved the budget on Monday."
# the upper-case letter soup SmolLM2 writes when steered at λ ≥ 36 (docs/evaluation.md §3, cache of `evaluate`)
SOUP = [
    "MISSESONBREWEDTAN EXPORTS UNITED STREET MISSESONCUTFALL BREWEDTANSTREETS UNITEDEXPORTSTAN CUTMISHGIND",
    "MINITEMCHOPPETSCAMPUPTCLEADGUELCUTMISHGINDCOMMISCURESVSTAHCLECURESSTREWVSTCUPFUINSMOREHGDEVEMSTCUPFUINS",
    "Minneset Republican and former US COPPA-DEMGREASER CHOSEN by DEATH: SHEMALLS: MIXTREATING THIS TREETHEM: "
    "BREAKING THE FREIGHT ON US: DEMGREASER: MORISON",
]


def test_fluent_text_is_not_degenerate():
    f = text_stats(FLUENT)
    assert isinstance(f, Fluency)
    assert not f.degenerate and f.reason == ""
    assert f.words == 28
    assert f.repeated_3gram == 0.0 and f.distinct_2 == 1.0
    assert math.isnan(f.perplexity) and math.isnan(f.tokens_per_word)


@pytest.mark.parametrize("text", [" ".join(["the"] * 12), " ".join([SENTENCE] * 5)])
def test_repetition_is_degenerate(text):
    f = text_stats(text)
    assert f.degenerate
    assert f.reason.startswith("repetitive")
    assert f.compression_ratio > text_stats(FLUENT).compression_ratio


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_is_degenerate(text):
    f = text_stats(text)
    assert f.degenerate and f.reason == "empty" and f.words == 0
    assert f.distinct_1 == 1.0 and f.repeated_3gram == 0.0 and f.upper_case == 0.0
    assert (f.compression_ratio == 0.0) == (text == "")


def test_punctuation_only_has_no_words():
    f = text_stats("... !!! --")
    assert f.degenerate and f.reason == "no words"


def test_exact_counts_on_a_small_example():
    # words: a b a b a c  (6 words, case and punctuation ignored)
    f = text_stats("A b, a B a c.")
    assert f.words == 6
    assert f.distinct_1 == pytest.approx(3 / 6)  # {a, b, c}
    assert f.distinct_2 == pytest.approx(3 / 5)  # ab ba ab ba ac -> {ab, ba, ac}
    assert f.repeated_3gram == pytest.approx(1 / 4)  # aba bab aba bac -> the 2nd "aba" repeats
    assert text_stats("one two").distinct_2 == 1.0  # one bigram
    assert text_stats("one").distinct_2 == 1.0  # no bigram: 1.0 by definition


def test_upper_case_soup_is_flagged_without_a_model():
    for text in SOUP:
        f = text_stats(text)
        assert f.degenerate and "non-words" in f.reason and f.upper_case > 0.5, text
    short = text_stats("FBI and NSA officials met the CIA.")  # acronyms in a short line are not soup
    assert not short.degenerate


def test_to_json_is_json_safe():
    d = text_stats(FLUENT).to_json()
    assert d["perplexity"] is None and d["tokens_per_word"] is None and d["degenerate"] is False
    assert json.loads(json.dumps(d, allow_nan=False)) == d


# ---- perplexity on the tiny model (built in code, offline) ----


@pytest.fixture(scope="module")
def tiny_lm():
    return load_model("tiny-llama")


def hand_perplexity(lm, text: str) -> float:
    """exp(mean next-token NLL) from one unpadded forward pass."""
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    nll = -logp.gather(1, ids[0, 1:, None]).squeeze(1)
    return math.exp(nll.mean().item())


def test_perplexity_matches_a_hand_computed_forward(tiny_lm):
    texts = [FLUENT, "Police arrested two men.", SENTENCE, "The match ended 3-1 and the manager praised his team."]
    batched = perplexities(tiny_lm, texts, batch_size=4)  # right-padded to the longest
    for text, p in zip(texts, batched):
        assert math.isfinite(p) and p > 1.0
        assert p == pytest.approx(hand_perplexity(tiny_lm, text), rel=1e-4)
    assert perplexities(tiny_lm, texts, batch_size=1) == pytest.approx(batched, rel=1e-4)


def test_perplexity_nan_below_two_tokens(tiny_lm):
    one = next(w for w in ["The", "a", "."] if len(tiny_lm.tokenizer(w)["input_ids"]) == 1)
    p = perplexities(tiny_lm, ["", one, SENTENCE])
    assert math.isnan(p[0]) and math.isnan(p[1]) and math.isfinite(p[2])


@pytest.mark.parametrize("side", ["left", "right"])
def test_perplexity_leaves_tokenizer_and_model_as_they_were(tiny_lm, side):
    tok, model = tiny_lm.tokenizer, tiny_lm.model
    old_side = tok.padding_side
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tok.padding_side = side
    model.train()
    try:
        perplexities(tiny_lm, [FLUENT, SENTENCE], batch_size=2)
        assert tok.padding_side == side
        assert model.training  # the training flag is restored
    finally:
        tok.padding_side = old_side
        model.eval()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_fluency_adds_model_fields(tiny_lm):
    out = fluency([FLUENT, ""], tiny_lm)
    assert math.isfinite(out[0].perplexity) and math.isfinite(out[0].tokens_per_word)
    assert out[0].tokens_per_word == pytest.approx(tokens_per_word(tiny_lm.tokenizer, [FLUENT])[0])
    assert out[1].degenerate and out[1].reason == "empty" and math.isnan(out[1].perplexity)
    assert [f.words for f in out] == [text_stats(FLUENT).words, 0]
    assert fluency([FLUENT]) == [text_stats(FLUENT)]


# ---- the thresholds on the embedded SmolLM2 ----


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


@needs_smollm2
def test_smollm2_fluent_vs_nonsense(smollm2):
    words = FLUENT.split()
    random.Random(0).shuffle(words)
    shuffled = " ".join(words)
    fluent, shuffled_f, *soup = fluency([FLUENT, shuffled, *SOUP], smollm2)
    assert not fluent.degenerate, fluent.reason
    assert fluent.perplexity < MAX_PERPLEXITY / 10
    assert shuffled_f.perplexity > 10 * fluent.perplexity
    for f in soup:  # per-token perplexity does not see letter soup; tokens per word does
        assert f.degenerate and "tokens per word" in f.reason, f
