"""Steering decks (analysis/studies/deck.py): prepared as resumable long work, read back by talk mode, exported as one
self-contained HTML file. Tiny TOPL run on tiny-llama."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import steerable_topl_run

from topl_core.analysis.studies.deck import DeckConfig, create_deck, doc_path, read_deck
from topl_core.analysis.studies.deck_html import deck_html, write_deck_html
from topl_core.analysis.studies.deck_prepare import prepare_deck
from topl_core.analysis.token_colors import p_color
from topl_core.data.records import write_jsonl
from topl_core.foundations.status import read_status, request_stop


@pytest.fixture(scope="module")
def deck_config(tiny_records, tmp_path_factory) -> DeckConfig:
    root = tmp_path_factory.mktemp("deck")
    data = root / "tiny.jsonl"
    write_jsonl(tiny_records, data)
    run = steerable_topl_run(data, root / "topl-tiny", tiny_records)
    documents = tuple(dict.fromkeys(r.document for r in tiny_records))[:2]
    return DeckConfig(str(run.path), documents, (-64.0, 64.0), top_k=2, max_new_tokens=8, data=str(data))


def test_a_stopped_deck_resumes_without_regenerating_finished_summaries(deck_config, tmp_path):
    folder = create_deck(tmp_path / "deck", deck_config)
    assert deck_config.lambdas == (-64.0, 0.0, 64.0)  # the neutral λ (the merged model) joins the grid
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
            if not re.search(r"[^\W_]", s.text):  # no word at all: damage, not an unfaithful summary
                assert s.degenerate in ("empty", "no words")
    assert any(s.text.strip() for d in deck.documents for s in d.positions.values()), "no text to judge"
    third = prepare_deck(folder)
    assert (third.generated, third.skipped) == (0, total)


def test_the_shared_tiny_head_has_learned_its_training_tokens(deck_config, tiny_records):
    """The tiny TOPL run that the app, deck and browser tests steer and score (conftest.steerable_topl_config) has
    converged rather than landed wherever its last step threw it: its head ranks the bad tokens of its own training
    split well above chance, and its mean BCE there is below the base rate's (the best a constant p does)."""
    import numpy as np

    from topl_core.data.split import split_records
    from topl_core.inference.token_scores import TokenScorer, detection_auroc
    from topl_core.models.loading import load_model

    train_split = split_records(tiny_records, seed=0)["train"]
    scorer = TokenScorer(load_model("tiny-llama"), deck_config.adapter, precision="fp32", max_doc_tokens=64)
    scores = scorer.score(train_split)
    assert detection_auroc(scores)["head_auroc"] > 0.7
    gold = np.concatenate([s.gold for s in scores])
    p_good = np.concatenate([s.p_good for s in scores])[gold >= 0].astype(np.float64)
    good = gold[gold >= 0] == 1
    bce = -np.mean(np.log(np.where(good, p_good, 1 - p_good)))
    rate = good.mean()
    assert bce < -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))


@pytest.fixture(scope="module")
def prepared_deck(deck_config, tmp_path_factory):
    folder = create_deck(tmp_path_factory.mktemp("decks") / "deck", deck_config)
    assert prepare_deck(folder).state == "finished"
    return read_deck(folder)


CHROMIUM = os.environ.get("TOPL_CHROMIUM", "/usr/bin/chromium")


def chromium_or_skip():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium package (scripts/setup.sh does it)")
    return pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


def shown(s) -> str:
    return s.text.strip() or "(empty)"


def test_exported_html_works_from_disk_with_the_network_off(prepared_deck, tmp_path):
    """The file opens from disk in Chromium with no server and no network; the slider and the keys show the cached
    summary of each λ, coloured by the head's p(good)."""
    sync_api = chromium_or_skip()
    deck, cfg = prepared_deck, prepared_deck.config
    path = write_deck_html(deck, tmp_path / "deck.html")
    requested = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            ctx = browser.new_context(offline=True)
            ctx.on("request", lambda r: requested.append(r.url))
            page = ctx.new_page()
            page.goto(path.as_uri())
            steered = page.locator("#steered")
            doc0 = deck.documents[0]
            assert float(steered.get_attribute("data-lambda")) == 0.0  # opens at the merged model
            assert steered.inner_text().strip() == shown(doc0.at(0.0))
            assert page.locator("#base").inner_text().strip() == shown(doc0.base)
            caption = page.locator("#base-cap").inner_text()
            assert caption.startswith(f"DEGENERATE — {doc0.base.degenerate}" if doc0.base.degenerate else "factuality")
            page.locator("#lambda").focus()
            page.keyboard.press("ArrowRight")
            low, high = cfg.lambdas[0], cfg.lambdas[-1]
            assert float(steered.get_attribute("data-lambda")) == high
            assert steered.inner_text().strip() == shown(doc0.at(high))
            assert doc0.at(low).text != doc0.at(0.0).text  # so the next move must change the text shown
            page.keyboard.press("Home")  # the range input's own keys
            assert float(steered.get_attribute("data-lambda")) == low
            assert steered.inner_text().strip() == shown(doc0.at(low))
            tokens, s = page.locator("#steered .tok"), doc0.at(low)
            assert tokens.count() == len(s.tokens)
            assert [tokens.nth(i).get_attribute("style") for i in range(len(s.tokens))] == [
                f"background:{p_color(p)}" for p in s.p_good
            ]
            page.keyboard.press("PageDown")  # the next document, at the same λ
            assert page.locator("#doc-number").inner_text() == "Document 2 / 2"
            assert steered.inner_text().strip() == shown(deck.documents[1].at(low))
            assert "AUROC" in page.locator(".note").first.inner_text()
        finally:
            browser.close()
    assert requested and all(u.startswith("file://") for u in requested), requested


def test_steer_deck_command_prepares_exports_and_writes_frames(deck_config, tmp_path, capsys):
    """`steer --deck DIR` creates and prepares a deck and writes its HTML and PNG frames; run again, it resumes the
    deck with its own settings and generates nothing."""
    chromium_or_skip()
    from topl_core.cli import main as cli_main

    folder, html, frames = tmp_path / "deck", tmp_path / "talk.html", tmp_path / "frames"
    document = deck_config.documents[0]
    argv = ["steer", "--run", deck_config.adapter, "--deck", str(folder), "--data", deck_config.data, "--top-k", "2"]
    new = ["--document", document, "--lambdas", "-8", "0", "--max-new-tokens", "4"]
    rc = cli_main([*argv, *new, "--export-html", str(html), "--frames", str(frames), "--frame-lambdas", "-8", "0"])
    assert rc == 0
    deck = read_deck(folder)
    assert deck.complete and deck.config.documents == (document,) and deck.config.lambdas == (-8.0, 0.0)
    assert html.read_text() == deck_html(deck)
    pngs = sorted(frames.glob("*.png"))
    assert [p.name for p in pngs] == ["doc0-lambda+0.png", "doc0-lambda-8.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    capsys.readouterr()
    assert cli_main(argv) == 0
    assert "0 summaries generated, 3 already there (finished)" in capsys.readouterr().out


def test_a_probe_head_gives_the_verdict_where_asked(deck_config, tmp_path):
    """head="probe": a probe head fitted on the adapter's hidden states judges every summary, with its AUROC."""
    from dataclasses import replace

    cfg = replace(deck_config, documents=deck_config.documents[:1], lambdas=(0.0,), head="probe")
    folder = create_deck(tmp_path / "probe-deck", cfg)
    prepare_deck(folder)
    deck = read_deck(folder)
    assert deck.head["kind"] == "probe" and 0.0 <= deck.head["auroc"] <= 1.0 and deck.has_head
    assert "a probe head fitted on its hidden states" in deck.head_note
    merged = deck.documents[0].at(0.0)
    assert merged.text.strip() and len(merged.p_good) == len(merged.tokens) > 0


def test_a_truncated_deck_file_is_named_and_made_again(deck_config, tmp_path, capsys):
    """A document file cut short (a copy that stopped, a full disk): `steer --deck … --export-html` names the file and
    says its summaries are made again — in its output and in the deck's status, which the Talk page shows — then the
    deck is whole again and the next run has nothing to say."""
    from topl_core.cli import main as cli_main

    folder, html = tmp_path / "deck", tmp_path / "talk.html"
    argv = ["steer", "--run", deck_config.adapter, "--deck", str(folder), "--data", deck_config.data, "--top-k", "2",
            "--document", deck_config.documents[0], "--lambdas", "0", "--max-new-tokens", "4",
            "--export-html", str(html)]  # fmt: skip
    assert cli_main(argv) == 0
    doc = doc_path(folder, 0)
    whole = doc.read_bytes()
    doc.write_bytes(whole[: len(whole) // 2])
    deck = read_deck(folder)
    assert not deck.complete and [p for p, _ in deck.unreadable] == [doc]
    assert deck.unreadable_notes("x")[0].startswith(f"{doc}: unreadable (JSONDecodeError: ")
    capsys.readouterr()
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert f"{doc}: unreadable (JSONDecodeError: " in out and "its summaries are made again." in out
    assert "2 summaries generated, 0 already there (finished)" in out
    assert read_deck(folder).complete and html.read_text() == deck_html(read_deck(folder))
    (note,) = read_status(folder)["redone"]
    assert note.startswith(f"{doc}: unreadable")
    assert cli_main(argv) == 0
    assert "unreadable" not in capsys.readouterr().out and read_status(folder)["redone"] == []


SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "decks" / "demo-topl-smollm2"


def test_the_shipped_deck_opens_complete_and_is_listed_with_the_demo_adapters(monkeypatch):
    """Talk mode opens on a working deck in a fresh clone: the deck shipped with the demo adapters is complete, judged
    by the demo TOPL adapter's own head, listed after the user's decks, and hidden with the demo adapters."""
    from topl_core.analysis.studies.deck import deck_folders, is_shipped

    deck = read_deck(SHIPPED)
    assert deck.complete and deck.has_head and not deck.unreadable
    assert Path(deck.config.adapter).name == "topl-smollm2" and deck.config.precision == "fp32"
    page = deck_html(deck)
    assert all(d.base.text in page or json.dumps(d.base.text)[1:-1] in page for d in deck.documents)
    monkeypatch.delenv("TOPL_EXAMPLES_DIR", raising=False)
    assert deck_folders()[-1] == SHIPPED and is_shipped(SHIPPED)
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", "")
    assert SHIPPED not in deck_folders()


def test_the_shipped_deck_is_what_the_demo_adapter_writes():
    """The shipped deck's merged summary of its first document is the demo TOPL adapter's text today (fp32, greedy):
    a change that moves generation shows here (then rebuild the deck: docs/app.md)."""
    from conftest import smollm2_available

    from topl_core.inference.generate import GenerationConfig, generate, load_merged

    if not smollm2_available():
        pytest.skip("the embedded SmolLM2 is not converted here (make setup converts it)")
    deck = read_deck(SHIPPED)
    lm = load_merged("smollm2-135m", str(SHIPPED.parents[1] / "adapters" / "topl-smollm2"))
    first = deck.documents[0]
    text = generate(lm, [first.document], GenerationConfig(max_new_tokens=deck.config.max_new_tokens, precision="fp32"))
    assert text[0] == first.at(deck.config.how.neutral).text


def test_the_deck_job_is_launched_from_its_config_and_read_back_by_the_cli(tmp_path, monkeypatch):
    """launch_deck writes the deck and starts `steer --deck` on it, its command line built in launchers.deck_argv and
    read back by the CLI's parser; resume_deck_job starts the same command for the deck already there. Another deck in
    the folder is refused before anything starts."""
    from dataclasses import replace

    from topl_core.cli import build_parser
    from topl_core.foundations.errors import JobError, RunError
    from topl_core.jobs import launchers

    started = []

    def start_claimed(argv, lock, kind, env, info=None) -> Path:
        started.append((argv, kind))
        return lock.path.parent

    def launch(argv, job_dir, kind="command", env=None, info=None) -> Path:
        started.append((argv, kind))
        return Path(job_dir)

    monkeypatch.setattr(launchers, "start_claimed", start_claimed)
    monkeypatch.setattr(launchers, "launch", launch)
    cfg = DeckConfig("runs/an-adapter", ("A document.",), (-2.0, 2.0), max_new_tokens=8, precision="fp32")
    folder = launchers.launch_deck(cfg, tmp_path / "deck")
    assert folder == tmp_path / "deck" and read_deck(folder).config == cfg
    assert launchers.resume_deck_job(folder) == folder
    (first, kind), (again, again_kind) = started
    assert first == again and kind == again_kind == "deck"
    args = build_parser(first).parse_args(first)
    assert (args.run, args.deck, args.precision) == (cfg.adapter, str(folder), "fp32")
    with pytest.raises(RunError, match="another deck"):
        launchers.launch_deck(replace(cfg, max_new_tokens=9), folder)
    with pytest.raises(JobError, match="no deck"):
        launchers.resume_deck_job(tmp_path / "empty")
    assert len(started) == 2
