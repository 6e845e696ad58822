"""`recommend` (analysis/evaluation/recommend.py): τ flags the stated share of the merged model's own tokens on dev
documents, λ comes from the dev search, the untested settings say so, the result is cached with the adapter's analysis
and a held-out measurement is logged on every call — τ and each λ's dev figure checked against summaries generated and
scored again outside recommend; on tiny-gemma3 (its numbers say nothing about the method)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import tiny_config

from topl_core.analysis.evaluation import recommend as rec_module
from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.evaluate import steering_vectors_for
from topl_core.analysis.evaluation.gated_comparison import GatedStudy
from topl_core.analysis.evaluation.recommend import (
    ModeDefaults,
    RecommendSettings,
    opening,
    recommend,
    recommended,
    tau_for_share,
)
from topl_core.analysis.evaluation.scorers import make_scorer, score_summary
from topl_core.cli import main
from topl_core.data.records import Record, write_jsonl
from topl_core.foundations.errors import ConfigError
from topl_core.inference.generate import generate, load_merged
from topl_core.inference.token_scores import TokenScorer
from topl_core.models.loading import ModelSpec, load_model
from topl_core.runtime.session import SteeringSession
from topl_core.training.adapters import open_adapter
from topl_core.training.trainer import train


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    """A 3-step TOPL run on tiny-gemma3, whose merged model writes text (tiny-llama's ends its summaries at once)."""
    data = write_jsonl(news_records, tmp_path_factory.mktemp("data") / "news.jsonl")
    cfg = tiny_config(
        model="tiny-gemma3", steps=3, lr=5e-3, precision="fp32", batch_size=4, max_val_examples=4, eval_every=3
    )
    return train(replace(cfg, data=str(data)), tmp_path_factory.mktemp("runs") / "topl-rec", records=news_records)


CFG = EvalConfig(max_new_tokens=6, precision="fp32")


def dev_factuality(run, lam: float, docs) -> float:
    """The mean sentence-protocol factuality of the always-on summaries at λ on `docs`, generated and scored here,
    outside the recommendation's code path."""
    adapter = open_adapter(run)
    v = GatedStudy(str(adapter.path)).always_on(lam)
    session = SteeringSession.from_run(adapter.path, steering_vectors_for(adapter, CFG))
    texts = [g.text for g in session.generations([d.document for d in docs], v.lam, CFG.generation, how=v.how)]
    scorer = make_scorer(CFG.scorer)
    return float(np.mean([score_summary(scorer, d.document, t, "sentence").score for d, t in zip(docs, texts)]))


def test_tau_flags_at_least_the_share_and_no_more_than_a_grid_step_beyond():
    rng = np.random.default_rng(0)
    p = rng.beta(8, 1, size=5000)  # a head that finds most of the model's own tokens good
    for share in (0.01, 0.1, 0.3):
        tau = tau_for_share(p, share)
        assert (p < tau).mean() >= share and (p < tau - 0.01).mean() < share
    assert tau_for_share(np.full(10, 0.999), 0.5) == 1.0 and np.isnan(tau_for_share(np.zeros(0), 0.1))
    with pytest.raises(ConfigError, match="flag_share"):
        RecommendSettings(flag_share=1.5)


def test_recommend_on_a_tiny_adapter_is_cached_and_logs_its_heldout_figure(run, tmp_path, monkeypatch, capsys):
    """τ and λ checked against the merged model's own summaries and the always-on ones generated and scored again
    outside recommend."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    settings = RecommendSettings(n_split=2, n_cliff=1, flag_share=0.25, lambdas=(1.0, 4.0), heldout=True)
    cfg = CFG
    assert recommended(run.path) is None and "no recommendation" in opening(run.path, "gated").source
    rec = recommend(run.path, settings, cfg)
    v = rec.values
    docs = GatedStudy(str(run.path), n_split=2, n_cliff=1).documents(cfg, "val")
    merged = load_merged(ModelSpec.computing("tiny-gemma3", "fp32", "cpu"), open_adapter(run.path))
    texts = generate(merged, [d.document for d in docs], cfg.generation)
    base = load_model(ModelSpec.computing("tiny-gemma3", "fp32", "cpu"))  # the scorer adds the adapter itself
    scorer = TokenScorer(base, open_adapter(run.path), "fp32", max_doc_tokens=cfg.max_doc_tokens)
    said = [Record(d.doc_id, d.document, t, token_labels_known=False) for d, t in zip(docs, texts) if t.strip()]
    scored = scorer.score(said)
    p = np.concatenate([x.p_good for x in scored])
    tau = next(s for s in rec.settings if s.name == "tau")
    assert (p < v["tau"]).mean() >= 0.25 > (p < v["tau"] - 0.01).mean()  # the least τ on the grid that flags 25%
    assert tau.evidence["tokens"] == len(p) and tau.evidence["documents"] == rec.documents == len(docs)
    kinds = {d.doc_id: d.set for d in docs}
    for kind, share in tau.evidence["flagged_at_tau_by_set"].items():  # each kind of dev text, flagged at τ
        q = np.concatenate([x.p_good for x, r in zip(scored, said) if kinds[r.id] == kind])
        assert share == pytest.approx(float((q < v["tau"]).mean()))
    assert set(tau.evidence["flagged_at_tau_by_set"]) == {"ID", "OOD"}
    searched = {r["setting"]: r for r in rec.rows()}["always_on_lambda"]["dev"]
    for row in searched:  # each λ's dev factuality, generated and scored again here
        assert row["factuality"] == pytest.approx(dev_factuality(run.path, row["lambda"], docs))
    assert v["always_on_lambda"] == max(searched, key=lambda r: r["score"])["lambda"]
    assert "untested" in next(s for s in rec.settings if s.name == "layer").source
    assert "untested" in next(s for s in rec.settings if s.name == "sites").source
    line = rec.line()
    assert line.startswith(f"τ = {v['tau']:.2f}, λ = {v['gated_lambda']:g}") and f"from {len(docs)} dev" in line
    assert rec.heldout and rec.heldout["documents"] >= 1
    log = rec_module.heldout_log_path()
    assert len(log.read_text().splitlines()) == 1

    def no_generation(*args, **kwargs):
        raise AssertionError("generated again: the recommendation is not cached")

    monkeypatch.setattr(rec_module, "_compute", no_generation)
    again = recommend(run.path, settings, cfg)  # from the cache, equal (NaN intervals of one document: as text)
    assert json.dumps(again.to_json(), sort_keys=True) == json.dumps(rec.to_json(), sort_keys=True)
    assert len(log.read_text().splitlines()) == 2  # the held-out figure read again: logged again
    out = tmp_path / "rec.json"
    argv = ["recommend", "--run", str(run.path), "--n-split", "2", "--n-cliff", "1", "--flag-share", "0.25"]
    argv += ["--lambdas", "1", "4", "--heldout", "--max-new-tokens", "6", "--precision", "fp32", "--json", str(out)]
    assert main(argv) == 0
    assert rec.line() in capsys.readouterr().out
    assert json.loads(out.read_text())["settings"][0]["value"] == v["tau"]
    last = recommended(run.path).to_json()  # the one computed last (NaN intervals of one document: as text)
    assert json.dumps(last, sort_keys=True) == json.dumps(rec.to_json(), sort_keys=True)


def test_steer_and_the_forms_open_at_the_recommendation_and_an_explicit_value_wins(run, tmp_path, monkeypatch, capsys):
    """What `recommended` reads (the recommendation computed last, whatever its settings) is what `steer` runs at
    when neither τ nor λ is given — the merged model's λ beside the recommended one, the source on one line — and
    what a mode the recommendation does not cover opens at (the defaults, said)."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    rec = recommend(
        run.path,
        RecommendSettings(n_split=1, n_cliff=0, flag_share=0.5, lambdas=(3.0,)),
        EvalConfig(max_new_tokens=6, precision="fp32"),
    )
    tau = rec.values["tau"]
    gated = opening(run.path, "gated")
    assert (gated.tau, gated.lam) == (
        tau,
        3.0,
    ) and gated.source == f"τ = {tau:.2f}, λ = 3: recommended from 1 dev documents"
    assert opening(run.path, "vector") == ModeDefaults(None, 3.0, "λ = 3: recommended from 1 dev documents")
    assert opening(run.path, "conditional").lam is None and "defaults" in opening(run.path, "conditional").source
    assert gated.position([-4, -2, 0, 2, 4], 0) == 2 and gated.position([-2, 0, 2], 0) == 0  # nearest, in range
    assert gated.bound((1, 2, 4, 8), 2) == 4 and gated.bound((1, 2, 4, 8), 4) == 4  # room beyond λ = 3

    doc = "The council approved the new budget on Monday after a long debate, the mayor said."
    steer = ["steer", "--run", str(run.path), "--mode", "gated", "--document", doc, "--no-base"]
    steer += ["--max-new-tokens", "4", "--precision", "fp32", "--limit", "4"]
    assert main([*steer, "--json", str(tmp_path / "opened.json")]) == 0
    out = capsys.readouterr().out
    assert f"{gated.source} (τ and λ not given; gated (" in out
    opened = json.loads((tmp_path / "opened.json").read_text())
    assert opened["steering"]["tau"] == tau and [g["lambda"] for g in opened["generations"]] == [0.0, 3.0]
    assert main([*steer, "--tau", "0.3", "--lambdas", "2", "--json", str(tmp_path / "given.json")]) == 0
    assert "recommended" not in capsys.readouterr().out
    given = json.loads((tmp_path / "given.json").read_text())
    assert given["steering"]["tau"] == 0.3 and [g["lambda"] for g in given["generations"]] == [2.0]


def test_an_adapter_without_a_head_gets_its_always_on_lambda_and_no_gate(tmp_path, news_records, monkeypatch):
    """SFT has no head, so no gate: its τ and gated λ are None with the reason, its always-on λ is the dev search's
    (evidence: a dev score per λ searched), held out against the merged model alone, and the vector mode opens at it."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(news_records, tmp_path / "news.jsonl")
    cfg = tiny_config(model="tiny-gemma3", method="sft", steps=1, precision="fp32", data=str(data))
    sft = train(cfg, tmp_path / "sft", records=news_records)
    settings = RecommendSettings(n_split=2, n_cliff=0, lambdas=(1.0, 3.0), heldout=True)
    rec = recommend(sft.path, settings, CFG)
    v = rec.values
    assert v["tau"] is None and v["gated_lambda"] is None and v["always_on_lambda"] in (1.0, 3.0)
    searched = {r["setting"]: r for r in rec.rows()}["always_on_lambda"]["dev"]
    assert [r["lambda"] for r in searched] == [1.0, 3.0] and all(r["n"] == rec.documents >= 1 for r in searched)
    docs = GatedStudy(str(sft.path), n_split=2, n_cliff=0).documents(CFG, "val")
    for row in searched:  # each λ's dev factuality, generated and scored again here
        assert row["factuality"] == pytest.approx(dev_factuality(sft.path, row["lambda"], docs))
    assert v["always_on_lambda"] == max(searched, key=lambda r: r["score"])["lambda"]
    line = rec.line()
    assert line.startswith(f"λ = {v['always_on_lambda']:g} (always-on; no gate to set") and "no head" in line
    compared = {r["comparison"] for r in rec.heldout["table"]}
    assert compared == {"merged", "always-on", "always-on − merged"}
    assert opening(sft.path, "vector").lam == v["always_on_lambda"]
    assert opening(sft.path, "gated") == ModeDefaults(
        None, None, "defaults: the recommendation sets nothing in gated mode"
    )
