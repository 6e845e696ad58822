"""The gated mode (runtime/gate.py) everywhere modes appear: `steer --mode gated --tau --keep` printing the
replaced tokens per summary, `bench --gated`'s figures, a gated deck and its export, the λ study's job command line,
the held-out comparison script on a few tiny documents, and the Steering, Talk and Evaluation pages (AppTest)."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import NEWS_PAIRS, tiny_config

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.data.records import write_jsonl
from topl_core.foundations.config_fields import config_args
from topl_core.inference.generate import GenerationConfig, generate, load_merged
from topl_core.runtime.modes import MODE_SETTINGS, SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.training.trainer import train

DOC = NEWS_PAIRS[0][1]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    cfg = tiny_config(steps=3, lr=5e-3, precision="fp32", batch_size=4, max_val_examples=4, eval_every=3)
    return train(cfg, tmp_path_factory.mktemp("runs") / "topl-gated", records=news_records)


@pytest.fixture(scope="module")
def data(tmp_path_factory, news_records) -> Path:
    return write_jsonl(news_records, tmp_path_factory.mktemp("data") / "news.jsonl")


@pytest.fixture(scope="module")
def session(run, news_records):
    return SteeringSession(load_merged("tiny-llama", run), build_steering_vectors(run, news_records, top_k=3))


def big(session) -> float:
    """A raw λ that moves the tiny model's residual stream by ~3 per steered site."""
    return 3.0 / min(session.vectors.norms().values())


def test_steer_prints_the_replaced_tokens_per_summary(run, data, session, tmp_path, capsys, monkeypatch):
    """`steer --mode gated --tau 1 --keep 8`: each summary's line of what the gate did, and the JSON's replacements
    and counts (τ = 1 takes back the second token, nothing after it with k = 8 ≥ the length)."""
    from topl_core.cli import main

    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "steer.json"
    rc = main(["steer", "--run", str(run.path), "--document", DOC, "--mode", "gated", "--tau", "1", "--keep", "8",
               "--units", "raw", "--lambdas", "0", str(big(session)), "--top-k", "3", "--data", str(data), "--split",
               "all", "--max-new-tokens", "8", "--no-base", "--json", str(out)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.count("-- gated: ") == 2 and "gated (raw, tau 1, keep 8)" in printed
    steered = json.loads(out.read_text())["generations"][1]
    assert steered["gate"]["taken_back"] == 1 and steered["gate"]["tokens"] == len(steered["token_ids"])
    assert json.loads(out.read_text())["steering"] == {**SteerConfig("gated", units="raw").key(), "tau": 1.0, "keep": 8}
    replaced = len(steered["replacements"])
    assert f"gated: {replaced} of {steered['gate']['tokens']} tokens replaced" in printed


@contextlib.contextmanager
def decode_forwards(model):
    """The model's one-position forwards while active (a decode step's; a prompt's forward runs all its positions),
    counted by a hook on the model itself: what a generation ran, whatever it says it ran."""
    seen: list[int] = []

    def count(_module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] == 1:
            seen.append(1)

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def test_gated_bench_figures(session):
    """bench --gated on the tiny model, against the same generations run and counted apart from it: the gated path's
    forwards are the decode forwards a hook on the model counts in a gated generation through a fresh session (the
    gate's own counter not read), its tokens, take-backs and replacements are that generation's; the merged and
    always-on token counts are one more than the decode forwards of a plain generate() and of an always-on generation
    (a greedy generation runs one forward per token after the first); every time is positive."""
    from topl_core.bench.gated import format_gated, gated_bench

    how, lam = SteerConfig("gated", units="raw", tau=0.6, keep=1), big(session)
    res = gated_bench(session, DOC, how, lam, new_tokens=8, precision="fp32", repeats=1, log=lambda _: 0)
    gen, lm = GenerationConfig.chosen("fp32", max_new_tokens=8), session.lm

    def fresh() -> SteeringSession:
        return SteeringSession(lm, session.vectors, head=session.head())

    with decode_forwards(lm.model) as gated_forwards:
        gated = fresh().grid_generations(DOC, [lam], gen, how=how)[0]
    with decode_forwards(lm.model) as merged_forwards:
        generate(lm, [DOC], gen)
    with decode_forwards(lm.model) as always_on_forwards:
        fresh().generate_steered(DOC, lam, gen, how=SteerConfig("vector", "generated", units="raw"))

    assert res["gated_forwards"] == len(gated_forwards) > 0
    assert res["tokens"]["gated"] == len(gated.token_ids) and res["taken_back"] == gated.gate.taken_back
    assert res["replaced"] == len(gated.replacements) <= res["taken_back"]
    assert res["tokens"]["merged"] == len(merged_forwards) + 1 and 1 <= res["tokens"]["merged"] <= 8
    assert res["tokens"]["always_on"] == len(always_on_forwards) + 1
    n = res["tokens"]["gated"]  # plain decoding of n tokens runs n - 1 forwards; a take-back runs two more
    assert res["gated_forwards"] >= n - 1 + 2 * res["taken_back"]
    assert min(res["merged_s"], res["always_on_s"], res["gated_s"]) > 0
    assert "gated_vs_merged_per_token" in format_gated(res)


def test_a_gated_deck_keeps_and_exports_its_replacements(run, data, session, tmp_path):
    """A deck in the gated mode: each steered summary keeps the gate's counts and replacements, the base model's
    has none, and the exported page carries each replaced token with its replacement (its script strikes it
    through)."""
    from topl_core.analysis.studies.deck import DeckConfig, create_deck, read_deck
    from topl_core.analysis.studies.deck_html import deck_data, deck_html
    from topl_core.analysis.studies.deck_prepare import prepare_deck

    cfg = DeckConfig(str(run.path), (DOC,), (big(session),), mode="gated", units="raw", tau=1.0, keep=8, top_k=3,
                     max_new_tokens=8, data=str(data), precision="fp32")  # fmt: skip
    folder = create_deck(tmp_path / "deck", cfg)
    assert prepare_deck(folder).state == "finished"
    deck = read_deck(folder)
    assert deck.config == cfg and deck.config.how.tau == 1.0
    doc, lam = deck.documents[0], max(cfg.lambdas)  # the grid: 0 (the merged model) and λ, rounded
    steered, merged = doc.at(lam), doc.at(0.0)
    assert doc.base.gate is None and merged.gate.taken_back == 0 and steered.gate.taken_back == 1
    shown = deck_data(deck)["docs"][0]["positions"][cfg.lambdas.index(lam)]
    assert shown["replaced"] == [[r.original, r.replacement] for r in steered.replacements]
    assert "tokens replaced" in shown["gate"] and "<del>" in deck_html(deck)


def test_the_lambda_study_job_spells_the_gate_settings(tmp_path):
    """A λ study with the gated mode: its settings reach the `evaluate` command line the job runs, and back."""
    from topl_core.analysis.evaluation.config import EvalConfig, EvalJob, LambdaStudy
    from topl_core.cli import build_parser
    from topl_core.jobs import launchers

    study = LambdaStudy((0.0, 2.0), ("vector", "gated"), settings=(("tau", 0.3), ("keep", 2)))
    argv = launchers.evaluation_argv(EvalJob(EvalConfig(n_id=2, n_ood=0), ("runs/a",), study=study), tmp_path)
    args = build_parser(argv).parse_args(argv)
    assert args.modes == ["vector", "gated"] and config_args(args, SteerConfig, only=MODE_SETTINGS) == dict(
        study.settings
    )
    with pytest.raises(ValueError, match="tau"):
        LambdaStudy((1.0,), ("gated",), settings=(("tau", 2.0),))


def test_the_comparison_script_on_a_few_tiny_documents(run, tmp_path, monkeypatch):
    """scripts/gated_comparison.py end to end on tiny-llama: settings chosen on dev documents only, the held-out table
    with each variant and each paired difference per metric, on documents other than the dev ones."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import gated_comparison

    out = tmp_path / "comparison.json"
    gated_comparison.main(["--run", str(run.path), "--n-dev", "1", "--n-test", "1", "--lambdas", "64", "--taus",
                           "0.5", "1", "--keeps", "2", "--max-new-tokens", "6", "--precision", "fp32",
                           "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    dev = [(r["variant"], r.get("tau")) for r in report["dev"]]
    assert dev == [("always-on", None), ("gated", 0.5), ("gated", 1.0)]
    assert report["choice"]["tau"] in (0.5, 1.0) and report["choice"]["keep"] == 2
    table = {(r["metric"], r["comparison"]) for r in report["heldout_all"]}
    for metric in ("factuality", "degenerate", "log_perplexity", "flagged_share"):
        assert {(metric, c) for c in ("merged", "always-on", "gated", "gated − always-on")} <= table
    held_out = {r["doc_id"] for r in report["rows"]}
    assert {r["variant"] for r in report["rows"]} == {"merged", "always-on", "gated"} and held_out
    del sys.modules["gated_comparison"]


def test_pages_offer_the_gate_and_show_what_it_replaced(run, news_records, monkeypatch, tmp_path):
    """The Steering page in the gated mode: τ and k inputs, the positions toggle off (the gate decides), and at τ = 1
    the steered box strikes through the token the head took back before its replacement, counted under the boxes
    and in its caption. The Talk page offers τ and k for a gated deck; the Evaluation page's λ study too."""
    pytest.importorskip("streamlit")
    from test_app import box_body, html_boxes, open_page

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "topl-gated").symlink_to(run.path)
    write_jsonl(news_records, tmp_path / "cache" / "data" / "news.jsonl")  # the page's documents
    env = {"TOPL_CACHE_DIR": str(tmp_path / "cache"), "TOPL_RUNS_DIR": str(runs), "TOPL_DEFAULT_MODEL": "tiny-llama"}
    for k, v in {**env, "TOPL_EXAMPLES_DIR": ""}.items():
        monkeypatch.setenv(k, v)
    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(runs / "topl-gated")).run()
    at.radio(key="steer.mode").set_value("gated").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.toggle(key="steer.generated_only").disabled
    at.number_input(key="steer.tau").set_value(1.0)
    at.number_input(key="steer.keep").set_value(160).run()
    at.selectbox(key="steer.range.constant").set_value(64.0).run()
    for lam in (64.0, -64.0):  # a random tiny model may keep its token at one end
        at.slider(key="steer.lambda.constant").set_value(lam).run()
        assert not at.exception, [e.value for e in at.exception]
        steered = html_boxes(at)[2]
        if 'class="topl-replaced"' in box_body(steered):
            break
    assert 'class="topl-diff-del"' in box_body(steered) and 'class="topl-replaced"' in box_body(steered)
    summary = next(m.value for m in at.markdown if 'id="steer-summary"' in m.value)
    assert re.search(r'data-replaced="1"', summary) and "gated: 1 of" in steered

    at = open_page("talk")
    at.selectbox(key="talk.run").set_value(str(runs / "topl-gated")).run()
    at.radio(key="talk.mode").set_value("gated").run()
    assert not at.exception and at.number_input(key="talk.tau").value == 0.5 and at.number_input(key="talk.keep")
    at = open_page("evaluation")
    at.radio(key="eval.mode").set_value("λ sweep (steering study)").run()
    assert not at.exception and at.number_input(key="eval.tau").value == 0.5
