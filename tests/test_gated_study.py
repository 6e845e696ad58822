"""`gated-study` (analysis/studies/gated_study.py): the merged model, always-on and gated steering at the adapter's
recommended settings on the same held-out documents of two domains, each figure checked against an independent
computation from the study's own rows or a generation made again; a study stopped part-way resumes from its cached
chunks to the same report; paired intervals (verdicts.paired) behave as a bootstrap of the mean must. On a tiny
TOPL run (its numbers say nothing about the method)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from topl_core.analysis.evaluation import evaluate as evaluate_module
from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.recommend import RecommendSettings, recommend
from topl_core.analysis.studies.gated_study import (
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    GatedDomains,
    held_out_documents,
    markdown,
    run_study,
)
from topl_core.analysis.studies.verdicts import MIN_PAIRED, paired
from topl_core.cli import main
from topl_core.data.halueval import load_halueval_rows
from topl_core.data.records import Record, read_jsonl, write_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.errors import ConfigError
from topl_core.inference.token_scores import TokenScorer
from topl_core.models.loading import ModelSpec, load_model
from topl_core.runtime.modes import SteerConfig
from topl_core.runtime.session import SteeringSession
from topl_core.training.adapters import open_adapter
from topl_core.training.config import tiny_topl_config
from topl_core.training.run_dirs import RunDir
from topl_core.training.trainer import train

CFG = EvalConfig(max_new_tokens=12, precision="fp32")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, news_records):
    """A 3-step TOPL run on tiny-gemma3: the tiny model whose merged model writes text (tiny-llama's ends at once)."""
    root = tmp_path_factory.mktemp("gated-study")
    cfg = tiny_topl_config(model="tiny-gemma3", data=str(write_jsonl(news_records, root / "news.jsonl")))
    return train(cfg, root / "topl", records=news_records).path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_paired_intervals_are_a_bootstrap_of_the_mean_difference():
    rng = np.random.default_rng(1)
    d = rng.normal(0.1, 0.5, size=400)
    c = paired(d)
    se = d.std(ddof=1) / np.sqrt(len(d))
    assert c.estimate == pytest.approx(d.mean()) and c.n == 400
    assert c.lo == pytest.approx(d.mean() - 1.96 * se, abs=0.25 * se)  # the percentiles of the resampled means
    assert c.hi == pytest.approx(d.mean() + 1.96 * se, abs=0.25 * se)
    from math import erf, sqrt

    assert c.agree == pytest.approx(0.5 * (1 + erf(d.mean() / se / sqrt(2))), abs=0.03)
    same = paired(np.full(MIN_PAIRED, 0.2))
    assert (same.lo, same.hi, same.agree) == (pytest.approx(0.2), pytest.approx(0.2), 1.0)
    few = paired([0.3, np.nan, 0.5])  # NaN dropped; too few documents for an interval
    assert few.n == 2 and few.estimate == pytest.approx(0.4) and not few.has_interval


def test_a_study_needs_the_recommendation_it_reads(adapter, cache):
    with pytest.raises(ConfigError, match="recommend --run"):
        run_study(GatedDomains(str(adapter), n_id=1, n_ood=0), CFG)


def test_in_domain_documents_are_held_out_and_topped_up_from_unseen_documents_of_the_corpus(adapter, tmp_path):
    """Data built from HaluEval: the test split first, then HaluEval documents the data never held."""
    rows = load_halueval_rows(limit=20)
    records = [
        Record(
            f"{r['doc_id']}:faithful",
            r["document"],
            r["right_summary"],
            source="halueval-perturbed",
            doc_id=r["doc_id"],
        )
        for r in rows
    ]
    copy = tmp_path / "halueval-run"  # the module's run is read only: a copy names the data
    shutil.copytree(adapter, copy)
    run = RunDir(copy)
    cfg, meta = run.read_config()
    run.write_config(dataclasses.replace(cfg, data=str(write_jsonl(records, tmp_path / "h.jsonl"))), meta)
    docs = held_out_documents(GatedDomains(str(copy), n_id=12, n_ood=4), CFG)
    split = split_records(read_jsonl(tmp_path / "h.jsonl"), seed=cfg.split_seed)
    seen = {r.document for r in split["train"] + split["val"]}
    ids = docs[IN_DOMAIN]
    assert len(ids) == 12 and not any(d.document in seen for d in ids)
    assert {d.doc_id for d in ids if d.source != "halueval-unseen"} == {r.doc_id for r in split["test"]}
    unseen = [d for d in ids if d.source == "halueval-unseen"]
    assert unseen and not {d.document for d in unseen} & {r["document"] for r in rows}
    assert len(docs[OUT_OF_DOMAIN]) == 4 and all(d.source.startswith("cliff") for d in docs[OUT_OF_DOMAIN])


def test_the_study_measures_what_it_says_and_resumes_to_the_same_report(adapter, cache, monkeypatch):
    settings = RecommendSettings(n_split=2, n_cliff=1, flag_share=0.3, lambdas=(1.0,))
    rec = recommend(adapter, settings, CFG).values
    made = []
    real = SteeringSession.generations
    monkeypatch.setattr(SteeringSession, "generations", lambda *a, **k: made.append("steered") or real(*a, **k))
    real_generate = evaluate_module.generate
    monkeypatch.setattr(evaluate_module, "generate", lambda *a, **k: made.append("merged") or real_generate(*a, **k))
    study = GatedDomains(str(adapter), n_id=2, n_ood=2, chunk=1)

    def killed_after_three(line: str) -> None:
        if len(made) == 3:
            raise KeyboardInterrupt("killed mid-way")

    with pytest.raises(KeyboardInterrupt):
        run_study(study, CFG, progress=killed_after_three)
    assert len(made) == 3
    report = run_study(study, CFG)
    assert len(made) == 12  # 2 domains × 2 chunks × 3 variants: the 3 finished before the stop were not made again
    again = run_study(study, CFG)
    assert len(made) == 12 and json.dumps(again, default=str) == json.dumps(report, default=str)

    rows = report["rows"]
    assert len(rows) == 12 and {(r["domain"], r["variant"]) for r in rows} == {
        (d, v) for d in (IN_DOMAIN, OUT_OF_DOMAIN) for v in ("merged", "always-on", "gated")
    }
    s = report["settings"]
    assert (s["tau"], s["gated_lambda"], s["always_on_lambda"]) == (rec["tau"], rec["gated_lambda"], 1.0)
    # the head's flags at τ, and what the gate replaced, made again outside the study
    lm = load_model(ModelSpec.computing("tiny-gemma3", "fp32", "cpu"))
    scorer = TokenScorer(lm, open_adapter(adapter), "fp32", max_doc_tokens=CFG.max_doc_tokens)
    docs = {d.doc_id: d for part in held_out_documents(study, CFG).values() for d in part}
    session = SteeringSession.from_run(adapter, evaluate_module.steering_vectors_for(adapter, CFG))
    how = SteerConfig("gated", tau=s["tau"], keep=s["keep"])
    for r in rows:
        doc = docs[r["doc_id"]].document
        if r["variant"] == "merged" and r["text"].strip():
            p = scorer.score([Record(r["doc_id"], doc, r["text"], token_labels_known=False)])[0].p_good
            assert r["flagged_at_tau"] == pytest.approx(float((p < s["tau"]).mean()))
        if r["variant"] == "gated":
            g = session.grid_generations(doc, [s["gated_lambda"]], CFG.generation, how=how)[0]
            assert g.text == r["text"] and r["replaced"] == len(g.replacements) <= r["tokens"] == g.gate.tokens
        else:
            assert np.isnan(r["replaced"])
    # every paired difference is the mean of the rows' own per-document differences
    for t in (t for t in report["table"] if " − " in t["comparison"]):
        a, b = t["comparison"].split(" − ")
        pick = lambda v: {
            r["doc_id"]: r[t["measure"]] for r in rows if r["domain"] == t["domain"] and r["variant"] == v
        }  # noqa: E731
        diffs = [x - pick(b)[k] for k, x in pick(a).items() if np.isfinite(x - pick(b)[k])]
        assert t["n"] == len(diffs) and (not diffs or t["mean"] == pytest.approx(np.mean(diffs)))
    gate = report["gate"][OUT_OF_DOMAIN]
    gated = [r for r in rows if r["domain"] == OUT_OF_DOMAIN and r["variant"] == "gated"]
    assert gate["summaries_with_a_replacement"] == sum(r["replaced"] > 0 for r in gated)
    assert {v["verdict"] for v in report["verdicts"]} <= {"holds", "unsettled", "does not hold"}
    assert all("no interval is computed" in v["why"] for v in report["verdicts"] if v["verdict"] == "unsettled")
    assert "## Verdicts" in markdown(report)


def test_the_command_writes_both_reports(adapter, cache, capsys):
    recommend(adapter, RecommendSettings(n_split=1, n_cliff=0, flag_share=0.3, lambdas=(1.0,)), CFG)
    out = cache / "study"
    argv = ["gated-study", "--run", str(adapter), "--out", str(out), "--n-id", "1", "--n-ood", "1"]
    assert main([*argv, "--max-new-tokens", "12", "--precision", "fp32"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert len(report["verdicts"]) == 10 and (out / "report.md").read_text() == markdown(report)
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
