"""Steering decks (topl_core.analysis.deck): prepared as resumable long work, read back by talk mode, exported as one
self-contained HTML file. Tiny TOPL run on tiny-llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topl_core.analysis.deck import DeckConfig, create_deck, doc_path, prepare_deck, read_deck
from topl_core.data.records import write_jsonl
from topl_core.status import read_status, request_stop


@pytest.fixture(scope="module")
def deck_config(tiny_run, tiny_records, tmp_path_factory) -> DeckConfig:
    data = tmp_path_factory.mktemp("deck-data") / "tiny.jsonl"
    write_jsonl(tiny_records, data)
    documents = tuple(dict.fromkeys(r.document for r in tiny_records))[:2]
    return DeckConfig(str(tiny_run.path), documents, (-8.0, 8.0), top_k=2, max_new_tokens=6, data=str(data))


def test_a_stopped_deck_resumes_without_regenerating_finished_summaries(deck_config, tmp_path):
    folder = create_deck(tmp_path / "deck", deck_config)
    assert deck_config.lambdas == (-8.0, 0.0, 8.0)  # the neutral λ (the merged model) joins the grid
    total = 2 * (1 + 3)

    def stop_after_three(done: int, _total: int) -> None:
        if done >= 3:
            request_stop(folder)

    first = prepare_deck(folder, progress=stop_after_three)
    assert (first.state, first.generated, first.skipped) == ("cancelled", 3, 0)
    status = read_status(folder)
    assert status["state"] == "cancelled" and (status["done"], status["total"]) == (3, total)
    partial = read_deck(folder)
    assert partial.done == 3 and not partial.complete
    before = json.loads(doc_path(folder, 0).read_text())
    assert not doc_path(folder, 1).exists()

    second = prepare_deck(folder)
    assert (second.state, second.generated, second.skipped) == ("finished", total - 3, 3)
    after = json.loads(doc_path(folder, 0).read_text())
    # what was finished is kept as it was (its generation time too: a regenerated summary would carry a new one)
    assert after["base"] == before["base"]
    for key, summary in before["positions"].items():
        assert after["positions"][key] == summary
    deck = read_deck(folder)
    assert deck.complete and read_status(folder)["state"] == "finished"
    assert deck.head["kind"] == "run" and 0.0 <= deck.head["auroc"] <= 1.0
    for doc in deck.documents:
        for s in (doc.base, *doc.positions.values()):
            assert s.tokens is not None and len(s.tokens) == len(s.p_good)
            assert all(0.0 <= p <= 1.0 for p in s.p_good)
            if s.text.strip():  # the head's verdict on every token of the summary
                assert "".join(s.tokens).strip() == s.text.strip()
                assert s.flagged_share == pytest.approx(sum(p < 0.5 for p in s.p_good) / len(s.p_good))
            else:
                assert s.tokens == () and s.flagged_share is None
            assert 0.0 <= s.factuality <= 1.0
    third = prepare_deck(folder)
    assert (third.generated, third.skipped) == (0, total)
