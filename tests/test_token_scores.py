"""Token scoring (head p(good) with offsets, surprisal baseline) and generation from merged adapters."""

from __future__ import annotations

import numpy as np
import torch

from topl_core.inference.generate import GenerationConfig, generate, load_merged
from topl_core.inference.token_scores import TokenScorer, detection_auroc
from topl_core.models.loading import load_model


def test_token_scores_cover_the_response(tiny_run, tiny_records):
    scorer = TokenScorer(load_model("tiny-llama"), tiny_run)
    rec = next(r for r in tiny_records if r.bad_spans)
    (s,) = scorer.score([rec])
    assert "".join(s.tokens) == rec.response
    assert ((0 <= s.p_good) & (s.p_good <= 1)).all()
    assert len(s.p_good) == len(s.surprisal) == len(s.gold) == len(s.offsets)
    assert set(s.gold.tolist()) == {0, 1}
    # batching does not change the values
    batched = scorer.score(tiny_records[:5], batch_size=5)
    alone = [scorer.score([r])[0] for r in tiny_records[:5]]
    for a, b in zip(batched, alone):
        assert np.allclose(a.p_good, b.p_good, atol=1e-5) and np.allclose(a.surprisal, b.surprisal, atol=1e-4)


def test_surprisal_is_the_base_models_next_token_loss(tiny_run, tiny_records):
    scorer = TokenScorer(load_model("tiny-llama"), tiny_run)
    rec = tiny_records[0]
    (s,) = scorer.score([rec])
    (e,) = scorer.encode([rec])
    base = load_model("tiny-llama").model
    with torch.no_grad():
        logits = base(torch.from_numpy(e.input_ids)[None]).logits[0]
    lp = torch.log_softmax(logits, -1)
    manual = [-lp[t - 1, e.input_ids[t]].item() for t in range(e.response_start, e.response_end)]
    assert np.allclose(s.surprisal, manual, atol=1e-4)


def test_score_text_for_unlabelled_input(tiny_run):
    s = TokenScorer(load_model("tiny-llama"), tiny_run).score_text("A document about Leeds.", "Leeds is a city.")
    assert (s.gold == -1).all() and len(s.tokens) > 2


def test_detection_auroc_counts_only_labelled_tokens(tiny_run, tiny_records):
    report = detection_auroc(TokenScorer(load_model("tiny-llama"), tiny_run).score(tiny_records[:10]))
    assert report["tokens"] > 0 and 0 < report["pct_bad"] < 100
    assert 0 <= report["head_auroc"] <= 1 and 0 <= report["surprisal_auroc"] <= 1


def test_flags_and_table_against_hand_counts(tiny_run, tiny_records):
    """TokenScores.flags / .table (the Token overlay page's metrics and chart), checked against counts by hand: the
    threshold at the median p(good) flags half the tokens; without gold labels only the counts are given."""
    from topl_core.foundations.metrics import auroc

    rec = next(r for r in tiny_records if r.bad_spans)
    (s,) = TokenScorer(load_model("tiny-llama"), tiny_run).score([rec])
    threshold = float(np.median(s.p_good))
    f, table = s.flags(threshold), s.table(threshold)
    flagged, bad = s.p_good < threshold, s.gold == 0
    assert f.tokens == len(table) == len(s.p_good) and f.flagged == int(flagged.sum()) == int(table["flagged"].sum())
    assert f.gold_bad == int(bad.sum()) == int((table["gold"] == "bad").sum()) > 0
    assert f.precision == (flagged & bad).sum() / flagged.sum() and f.recall == (flagged & bad).sum() / bad.sum()
    assert f.head_auroc == auroc(bad.astype(int), 1 - s.p_good) and 0 <= f.surprisal_auroc <= 1
    assert table["token"].tolist() == s.tokens and table["position"].tolist() == list(range(len(s.tokens)))
    unlabelled = TokenScorer(load_model("tiny-llama"), tiny_run).score_text("A document.", "A summary of it.").flags()
    assert unlabelled.gold_bad is None and unlabelled.precision is None and unlabelled.tokens > 2


def test_generation_is_deterministic_and_merged_differs_from_base(tiny_run, tiny_records):
    docs = [r.document for r in tiny_records[:3]]
    cfg = GenerationConfig(max_new_tokens=8)
    merged = load_merged("tiny-llama", tiny_run)
    a, b = generate(merged, docs, cfg), generate(merged, docs, cfg)
    assert a == b and len(a) == 3
    # batched generation (left padding) equals one-by-one
    assert a == [generate(merged, [d], cfg)[0] for d in docs]
    sampled = generate(merged, docs, GenerationConfig(max_new_tokens=8, mode="sample", seed=1))
    assert sampled == generate(merged, docs, GenerationConfig(max_new_tokens=8, mode="sample", seed=1))


def test_generation_works_without_chat_template():
    lm = load_model("tiny-gemma3")
    (out,) = generate(lm, ["A short document."], GenerationConfig(max_new_tokens=5))
    assert isinstance(out, str)


def test_response_only_logprobs_equal_full_logprobs():
    from topl_core.models.forward import next_token_logprobs

    for family in ("tiny-llama", "tiny-gemma3"):
        m = load_model(family).model
        ids = torch.tensor([[5, 9, 33, 71, 2, 8], [4, 4, 18, 90, 61, 7]])
        mask = torch.ones_like(ids)
        positions = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 0, 0, 1, 1, 1]], dtype=torch.bool)
        with torch.no_grad():
            full = next_token_logprobs(m, ids, mask)
            part = next_token_logprobs(m, ids, mask, positions)
        want = positions.clone()
        want[:, 0] = False
        assert torch.allclose(part[want], full[want], atol=1e-5)
        assert (part[~want] == 0).all()
