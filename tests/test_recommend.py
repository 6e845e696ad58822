"""`recommend` (analysis/evaluation/recommend.py): τ flags the stated share of the merged model's own tokens on dev
documents, λ comes from the dev search, the untested settings say so, the result is cached with the adapter's analysis
and a held-out measurement is logged on every call; on tiny-llama (its numbers say nothing about the method)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_config

from topl_core.analysis.evaluation import recommend as rec_module
from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.recommend import RecommendSettings, recommend, tau_for_share
from topl_core.cli import main
from topl_core.data.records import write_jsonl
from topl_core.foundations.errors import ConfigError
from topl_core.training.trainer import train


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    data = write_jsonl(news_records, tmp_path_factory.mktemp("data") / "news.jsonl")
    cfg = tiny_config(
        steps=3, lr=5e-3, precision="fp32", batch_size=4, max_val_examples=4, eval_every=3, data=str(data)
    )
    return train(cfg, tmp_path_factory.mktemp("runs") / "topl-rec", records=news_records)


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
    """The tiny adapter's merged model ends its summaries at once (3 steps), so its own summaries are stood in for
    by each document's first sentence: the head scores those tokens and τ is read from them."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(rec_module, "generate_for", lambda v, docs, *a: [d.document.split(". ")[0] + "." for d in docs])
    settings = RecommendSettings(n_split=2, n_cliff=0, flag_share=0.25, lambdas=(1.0,), heldout=True)
    cfg = EvalConfig(max_new_tokens=6, precision="fp32")
    rec = recommend(run.path, settings, cfg)
    v = rec.values
    tau = next(s for s in rec.settings if s.name == "tau")
    assert tau.evidence["flagged_at_tau"] >= 0.25 and tau.evidence["documents"] == rec.documents
    assert tau.evidence["tokens"] > 0 and tau.evidence["summaries"] == rec.documents >= 1
    assert 0 < v["tau"] <= 1 and v["gated_lambda"] == v["always_on_lambda"] == 1.0  # the one λ searched
    assert "untested" in next(s for s in rec.settings if s.name == "layer").source
    assert "untested" in next(s for s in rec.settings if s.name == "sites").source
    assert rec.line().startswith(f"τ = {v['tau']:.2f}, λ = 1") and f"from {rec.documents} dev documents" in rec.line()
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
    argv = ["recommend", "--run", str(run.path), "--n-split", "2", "--n-cliff", "0", "--flag-share", "0.25"]
    argv += ["--lambdas", "1", "--heldout", "--max-new-tokens", "6", "--precision", "fp32", "--json", str(out)]
    assert main(argv) == 0
    assert rec.line() in capsys.readouterr().out
    assert json.loads(out.read_text())["settings"][0]["value"] == v["tau"]


def test_an_adapter_without_a_head_has_no_gate_to_set(tmp_path, news_records, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    sft = train(tiny_config(method="sft", steps=1, precision="fp32"), tmp_path / "sft", records=news_records)
    rec = recommend(sft.path, RecommendSettings(n_split=1, n_cliff=0), EvalConfig(max_new_tokens=4, precision="fp32"))
    assert rec.values["tau"] is None and "no head" in rec.line()
