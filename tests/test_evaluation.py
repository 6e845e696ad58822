"""Factuality scorers and the evaluation runner: sentence splitting and the two protocols by hand, the offline
grounding scorer on hand-written supported vs swapped claims, its measured quality report (and cache), the
results table arithmetic, and the runner / λ sweep on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import CLIFF_CSV, negated_mode

from topl_core.analysis.evaluation import quality
from topl_core.analysis.evaluation.config import OOD_MEAN
from topl_core.analysis.evaluation.quality import measure_scorer_quality, scorer_quality
from topl_core.analysis.evaluation.scorers import GroundingScorer, Scorer, make_scorer, score_summary
from topl_core.analysis.evaluation.text import count_sentences, split_sentences
from topl_core.foundations.errors import ScorerError
from topl_core.runtime.modes import MODES

DOC = (
    "Police in Leeds arrested two men on Monday after a robbery at a jewellery shop on Briggate. "
    "Detective Inspector Sarah Hill said the men, aged 24 and 31, were held at a nearby station. "
    "The shop's owner, Mark Jones, said stock worth 45,000 pounds was taken."
)


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))


# --- sentences and protocols ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        ("One sentence only", ["One sentence only"]),
        ("First one. Second one! Third?", ["First one.", "Second one!", "Third?"]),
        (
            "Mr. Smith met Dr. Jones in the U.S. on Friday. They talked.",
            ["Mr. Smith met Dr. Jones in the U.S. on Friday.", "They talked."],
        ),
        ("J. K. Rowling wrote it. Sales rose 3.5 percent.", ["J. K. Rowling wrote it.", "Sales rose 3.5 percent."]),
        ('He said "we won." Then he left.', ['He said "we won."', "Then he left."]),
        ("the end. lower case does not start a sentence.", ["the end. lower case does not start a sentence."]),
        ("Line one\nLine two", ["Line one", "Line two"]),
        ("", []),
    ],
)
def test_split_sentences(text, want):
    assert split_sentences(text) == want
    assert count_sentences(text) == len(want)


class LengthScorer:
    """A stub: a claim's score is its length in characters / 100."""

    name = "length"

    def __init__(self):
        self.calls = []

    def score(self, document, claims):
        self.calls.append(list(claims))
        return [min(1.0, len(c) / 100) for c in claims]


def test_protocols_by_hand():
    s = LengthScorer()
    assert isinstance(s, Scorer)
    summary = "Short one. A somewhat longer second sentence here."
    sent = score_summary(s, DOC, summary, "sentence")
    assert sent.claims == ("Short one.", "A somewhat longer second sentence here.")
    assert sent.claim_scores == (0.10, 0.39)
    assert sent.score == pytest.approx((0.10 + 0.39) / 2) and sent.n_sentences == 2
    full = score_summary(s, DOC, summary, "full")
    assert full.claims == (summary,) and full.score == pytest.approx(len(summary) / 100)
    assert s.calls == [list(sent.claims), [summary]]
    assert score_summary(s, DOC, "   ", "sentence").score == 0.0  # an empty generation supports nothing
    with pytest.raises(ScorerError, match="protocol"):
        score_summary(s, DOC, summary, "paragraph")


def test_scorer_output_is_checked():
    class Bad:
        name = "bad"

        def score(self, document, claims):
            return [1.5 for _ in claims]

    with pytest.raises(ScorerError, match=r"\[0, 1\]"):
        score_summary(Bad(), DOC, "A claim.", "full")


# --- the offline grounding scorer -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "supported, hallucinated",
    [
        (
            "Police in Leeds arrested two men after a jewellery shop robbery.",
            "Police in Leeds arrested five men after a jewellery shop robbery.",
        ),
        ("The men were aged 24 and 31.", "The men were aged 24 and 39."),
        ("Stock worth 45,000 pounds was taken from the shop.", "Stock worth 85,000 pounds was taken from the shop."),
        (
            "Detective Inspector Sarah Hill said the men were held.",
            "Detective Inspector Sarah Brown said the men were held.",
        ),
        ("The owner, Mark Jones, said stock was taken.", "The owner, Mark Jones, said stock was taken in Manchester."),
        ("Police in Leeds arrested two men on Monday.", "Police in Leeds arrested two men on Thursday."),
        ("A robbery at a jewellery shop on Briggate.", "A robbery at a bakery on Briggate."),
    ],
)
def test_grounding_prefers_supported_claims(supported, hallucinated):
    g = GroundingScorer()
    good, bad = g.score(DOC, [supported, hallucinated])
    assert 0.0 <= bad < good <= 1.0


def test_grounding_components_by_hand():
    g = GroundingScorer()
    c = g.components(DOC, "Sarah Hill arrested 7 men in Leeds.")
    assert c["number"] == 0.0  # 7 is not in the document
    assert c["name"] == 1.0  # Hill, Leeds (the sentence-initial word is not counted as a name)
    assert c["unigram"] == pytest.approx(1.0)  # sarah hill arrest men leeds: all in the document
    assert g.score(DOC, ["Sarah Hill arrested 7 men in Leeds."]) == [0.0]
    assert g.score(DOC, ["It was there."]) == [1.0]  # only stopwords: nothing to check, nothing contradicts
    # spelled-out numbers meet digits
    assert GroundingScorer().components("Three people died.", "3 people died.")["number"] == 1.0
    # CLIFF's tokenised hyphens
    assert GroundingScorer().components("Sheikh al-Wefaq spoke.", "Then al - Wefaq spoke.")["unigram"] == 1.0


def test_make_scorer_and_hub_scorer_offline_message(monkeypatch):
    assert isinstance(make_scorer("grounding"), GroundingScorer)
    with pytest.raises(ScorerError, match="grounding"):
        make_scorer("nonsense")
    import topl_core.models.loading as models

    monkeypatch.setattr(models, "hub_reachable", lambda timeout_s=3.0: False)
    with pytest.raises(ScorerError, match="unreachable"):
        make_scorer("hub:nli:cross-encoder/nli-deberta-v3-base")


# --- measured quality ----------------------------------------------------------------------------------------


def _toy_cliff(path):
    rows = []
    for i in range(6):
        doc = f"The mayor of Leeds, Anna Price, opened {10 + i} new libraries on Monday."
        rows.append(
            {
                "dataset": "toy",
                "origin": "xsum",
                "id": i,
                "doc": doc,
                "summ": f"Anna Price opened {10 + i} libraries.",
                "model_name": "m",
                "cut": "test",
                "error_type": "correct",
                "annotated_span": "",
            }
        )
        rows.append(
            {
                "dataset": "toy",
                "origin": "xsum",
                "id": i,
                "doc": doc,
                "summ": f"Boris Kent opened {50 + i} libraries.",
                "model_name": "m",
                "cut": "test",
                "error_type": "['extrinsic-NP']",
                "annotated_span": "['Boris Kent']",
            }
        )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_quality_report_and_cache(tmp_path, monkeypatch):
    csv = _toy_cliff(tmp_path / "toy.csv")
    q = scorer_quality(GroundingScorer(), csv, n_halueval=0)
    t = q.table()
    assert set(t["dataset"]) == {"cliff-xsum"} and set(t["protocol"]) == {"sentence", "full"}
    assert (t["auroc"] == 1.0).all() and (t["n_faithful"] == 6).all() and (t["n_hallucinated"] == 6).all()
    assert "cliff-xsum 1.00" in q.summary()

    def boom(*a, **k):
        raise AssertionError("recomputed instead of reading the cache")

    monkeypatch.setattr(quality, "measure_scorer_quality", boom)
    again = scorer_quality(GroundingScorer(), csv, n_halueval=0)
    assert again == q  # exact round trip
    with pytest.raises(AssertionError, match="recomputed"):  # other settings → another key
        scorer_quality(GroundingScorer(gamma_name=2.0), csv, n_halueval=0)


@pytest.mark.skipif(not CLIFF_CSV.exists(), reason=f"CLIFF CSV not found at {CLIFF_CSV}")
def test_grounding_auroc_on_cliff_is_measured_and_above_chance():
    q = measure_scorer_quality(GroundingScorer(), CLIFF_CSV, n_halueval=0, protocols=("sentence",))
    t = q.table().set_index("dataset")
    assert t.loc["cliff-xsum", "n_faithful"] == 126 and t.loc["cliff-xsum", "n_hallucinated"] == 174
    assert t.loc["cliff-cnndm", "n_faithful"] == 248 and t.loc["cliff-cnndm", "n_hallucinated"] == 52
    # the measured AUROCs are in docs/evaluation.md; guard against regressions, not a claim of quality
    assert t.loc["cliff-xsum", "auroc"] > 0.70 and t.loc["cliff-cnndm", "auroc"] > 0.70


# --- results table and runner --------------------------------------------------------------------------------


def test_results_table_arithmetic():
    from topl_core.analysis.evaluation.evaluate import results_table

    per_doc = pd.DataFrame(
        [
            {
                "variant": "base",
                "set": "ID",
                "source": "h",
                "score_sentence": 0.2,
                "score_full": 0.1,
                "n_sentences": 2,
                "n_words": 10,
            },
            {
                "variant": "base",
                "set": "ID",
                "source": "h",
                "score_sentence": 0.4,
                "score_full": 0.3,
                "n_sentences": 4,
                "n_words": 20,
            },
            {
                "variant": "base",
                "set": "OOD",
                "source": "cliff-xsum",
                "score_sentence": 0.9,
                "score_full": 0.8,
                "n_sentences": 3,
                "n_words": 30,
            },
            {
                "variant": "topl",
                "set": "ID",
                "source": "h",
                "score_sentence": 1.0,
                "score_full": 1.0,
                "n_sentences": 1,
                "n_words": 5,
            },
        ]
    )
    t = results_table(per_doc, "sentence", by_source=True)
    assert list(t.index) == ["base", "topl"]
    assert t.loc["base", "ID"] == pytest.approx(0.3) and t.loc["base", "OOD"] == pytest.approx(0.9)
    assert t.loc["base", "average"] == pytest.approx(0.6) and t.loc["base", "sentences"] == pytest.approx(3.0)
    # supported sentences: each summary's sentence scores summed (score × count), averaged: (0.4 + 1.6 + 2.7) / 3
    assert t.loc["base", "supported"] == pytest.approx(4.7 / 3) and t.loc["topl", "supported"] == pytest.approx(1.0)
    assert t.loc["base", "cliff-xsum"] == pytest.approx(0.9)
    assert np.isnan(t.loc["topl", "OOD"]) and t.loc["topl", "average"] == 1.0 and t.loc["topl", "n_OOD"] == 0
    assert results_table(per_doc, "full").loc["base", "ID"] == pytest.approx(0.2)


def _llm_aggrefact_rows() -> list[dict]:
    """LLM-AggreFact's shape (doc, claim, label, dataset; no id), three datasets, documents repeated per claim."""
    rows = []
    for dataset in ("AggreFact-CNN", "Wice", "RAGTruth"):
        for k in range(3):
            doc = f"{dataset} document {k}. {DOC}"
            rows += [{"doc": doc, "claim": f"claim {j}", "label": j % 2, "dataset": dataset} for j in range(2)]
    return rows


def test_ood_over_a_benchmark_takes_n_documents_per_dataset(tmp_path):
    from topl_core.analysis.evaluation.config import EvalConfig
    from topl_core.analysis.evaluation.documents import ood_documents
    from topl_core.foundations.errors import DataError

    table = pd.DataFrame(_llm_aggrefact_rows())
    table.to_csv(tmp_path / "llm-aggrefact.csv", index=False)
    table.to_parquet(tmp_path / "llm-aggrefact.parquet")
    for name in ("llm-aggrefact.csv", "llm-aggrefact.parquet"):
        docs = ood_documents(EvalConfig(n_id=0, n_ood=2, ood_data=str(tmp_path / name)))
        assert [d.source for d in docs] == ["AggreFact-CNN"] * 2 + ["Wice"] * 2 + ["RAGTruth"] * 2
        assert len({d.doc_id for d in docs}) == 6 and docs[0].document.startswith("AggreFact-CNN document 0.")
    table.drop(columns=["dataset"]).to_csv(tmp_path / "no-dataset.csv", index=False)
    with pytest.raises(DataError, match=r"missing column\(s\) \['dataset'\]"):
        ood_documents(EvalConfig(n_id=0, n_ood=2, ood_data=str(tmp_path / "no-dataset.csv")))
    with pytest.raises(DataError, match="no such file"):
        ood_documents(EvalConfig(n_id=0, n_ood=2, ood_data=str(tmp_path / "absent.csv")))


def test_mean_over_ood_sources_and_protocol_agreement_by_hand():
    from scipy.stats import spearmanr

    from topl_core.analysis.evaluation.evaluate import protocol_agreement, results_table

    rows = []
    for variant, shift in (("a", 0.0), ("b", 0.1), ("c", 0.3)):
        for source, scores in (("Wice", (0.2, 0.4, 0.9)), ("RAGTruth", (0.6,))):
            for k, x in enumerate(scores):
                rows.append(
                    {
                        "variant": variant,
                        "set": "OOD",
                        "source": source,
                        "score_sentence": x + shift,
                        "score_full": (x + shift) ** 2 - 0.05 * k,
                        "n_sentences": 1,
                        "n_words": 3,
                    }  # fmt: skip
                )
    per_doc = pd.DataFrame(rows)
    t = results_table(per_doc, "sentence", by_source=True)
    assert t.loc["a", "OOD"] == pytest.approx(0.525)  # over documents: 3 of Wice, 1 of RAGTruth
    assert t.loc["a", OOD_MEAN] == pytest.approx((0.5 + 0.6) / 2)  # each dataset weighs the same
    agreement = protocol_agreement(per_doc)
    assert agreement["summaries"] == pytest.approx(spearmanr(per_doc["score_sentence"], per_doc["score_full"])[0])
    assert agreement["variants"] == pytest.approx(1.0) and agreement["n_variants"] == 3
    assert np.isnan(protocol_agreement(per_doc[per_doc["variant"] != "c"])["variants"])


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory, tiny_records):
    """A tiny Gemma3 TOPL run (the tiny Gemma3 generates non-empty text, unlike the tiny Llama)."""
    from conftest import tiny_config

    from topl_core.data.records import write_jsonl
    from topl_core.training.trainer import train

    d = tmp_path_factory.mktemp("gemma")
    data = write_jsonl(tiny_records, d / "data.jsonl")
    return train(tiny_config(model="tiny-gemma3", steps=4, data=str(data)), d / "run", records=tiny_records), data


def test_evaluate_runner_and_lambda_sweep(gemma_run, monkeypatch):
    from topl_core.analysis.evaluation import evaluate as evaluation
    from topl_core.analysis.evaluation.config import EvalConfig, Variant
    from topl_core.analysis.evaluation.documents import id_documents
    from topl_core.analysis.evaluation.evaluate import evaluate
    from topl_core.analysis.evaluation.lambda_study import lambda_curve, lambda_sweep

    run, data = gemma_run
    cfg = EvalConfig(
        data=str(data),
        n_id=3,
        n_ood=2 if CLIFF_CSV.exists() else 0,
        max_new_tokens=6,
        max_doc_tokens=64,
        model="tiny-gemma3",
    )
    docs = id_documents(cfg)
    assert len(docs) == 3 and len({d.doc_id for d in docs}) == 3
    variants = [
        Variant.base("tiny-gemma3"),
        Variant.merged(run.path),
        Variant.steered(run.path, 0.0),
        Variant.steered(run.path, 8.0),
    ]
    res = evaluate(variants, cfg)
    n_docs = cfg.n_id + cfg.n_ood
    assert len(res.per_doc) == 4 * n_docs
    by = {v.name: res.per_doc[res.per_doc["variant"] == v.name]["text"].tolist() for v in variants}
    assert by[variants[2].name] == by[variants[1].name]  # λ = 0 is the merged model
    assert any(t for t in by[variants[1].name])
    assert res.per_doc["score_sentence"].between(0, 1).all() and res.per_doc["score_full"].between(0, 1).all()
    assert (res.per_doc["n_sentences"] == [count_sentences(t) for t in res.per_doc["text"]]).all()
    table = res.table()
    assert list(table.index) == [v.name for v in variants] and {"ID", "OOD", "average", "sentences"} <= set(
        table.columns
    )
    assert res.quality is not None and res.quality.scorer == "grounding-v1"

    # generations are cached: a second evaluation does not generate again
    def boom(*a, **k):
        raise AssertionError("generated again")

    monkeypatch.setattr(evaluation, "generate", boom)
    again = evaluate(variants[:2], cfg, measure_quality=False)
    assert again.per_doc["text"].tolist() == res.per_doc["text"].tolist()[: 2 * n_docs]
    monkeypatch.undo()

    monkeypatch.setitem(MODES, "negated", negated_mode())  # a mode added in one place reaches the study
    df = lambda_sweep(
        run.path,
        [-8.0, 0.0, 8.0],
        cfg,
        sets=("ID",),
        modes=("vector", "conditional", "random", "negated"),
        grids={"conditional": [0.0, 1.0]},
    )
    assert len(df) == (3 + 2 + 3 + 3) * 3
    text = {(r.mode, r.lam, r.doc_id): r.text for r in df.rename(columns={"lambda": "lam"}).itertuples()}
    assert all(t == text[("vector", -lam, doc)] for (mode, lam, doc), t in text.items() if mode == "negated")
    vector = df[df["mode"] == "vector"]
    assert sorted(vector["lambda"].unique()) == [-8.0, 0.0, 8.0]
    assert vector[vector["lambda"] == 0.0]["text"].tolist() == by[variants[1].name][:3]
    cond = df[df["mode"] == "conditional"]  # λ = 1: the merged model; λ = 0: the base model
    assert cond[cond["lambda"] == 1.0]["text"].tolist() == by[variants[1].name][:3]
    assert cond[cond["lambda"] == 0.0]["text"].tolist() == by[variants[0].name][:3]
    assert df["perplexity"].notna().any() and df["degenerate"].isin([True, False]).all()
    curve = lambda_curve(df)
    assert len(curve) == 3 + 2 + 3 + 3 and (curve["factuality_n"] == 3).all()
    assert list(curve[curve["mode"] == "vector"]["lambda"]) == [-8.0, 0.0, 8.0]
    assert {"factuality", "factuality_lo", "factuality_hi", "degenerate", "perplexity", "sentences"} <= set(curve)
    row = curve.iloc[0]
    assert row["factuality_lo"] <= row["factuality"] <= row["factuality_hi"]


def test_evaluate_cli_over_a_benchmark_prints_datasets_and_protocol_agreement(gemma_run, tmp_path, capsys):
    from topl_core.cli import main

    run, data = gemma_run
    bench = tmp_path / "llm-aggrefact.csv"
    pd.DataFrame(_llm_aggrefact_rows()).to_csv(bench, index=False)
    out = tmp_path / "eval.json"
    args = ["evaluate", "--run", str(run.path), "--data", str(data), "--n-id", "1", "--ood-data", str(bench),
            "--n-ood", "1", "--max-new-tokens", "4", "--max-doc-tokens", "64", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"OOD = {bench}" in printed and "protocols agree: Spearman" in printed
    report = json.loads(out.read_text())
    merged = next(r for r in report["table_sentence"] if r["variant"].startswith("merged"))
    assert {"AggreFact-CNN", "Wice", "RAGTruth", OOD_MEAN} <= set(merged) and merged["n_OOD"] == 3
    assert report["protocol_agreement"]["n_summaries"] == 2 * 4  # base and merged, 1 ID + 3 OOD documents


def test_evaluate_cli_help(capsys):
    from topl_core.cli import main

    for cmd in ("evaluate", "label-sensitivity"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "usage" in capsys.readouterr().out


def test_word_chunks_cover_the_document():
    from topl_core.analysis.evaluation.scorers import _word_chunks

    doc = " ".join(f"w{i}" for i in range(103))
    for size in (10, 40, 200):
        chunks = _word_chunks(doc, size)
        assert all(len(c.split()) <= size for c in chunks)
        assert set(" ".join(chunks).split()) == set(doc.split())
        assert chunks[0].split()[0] == "w0" and chunks[-1].split()[-1] == "w102"


def test_hub_scorer_runs_on_local_models(tmp_path):
    """The hub code path on local tiny models (a random 3-label NLI classifier and a random causal LM): one score in
    [0, 1] per claim, a claim's score is its best chunk's, and MiniCheck's Yes/No token ids are found."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from topl_core.analysis.evaluation.scorers import HubScorer, _word_chunks
    from topl_core.models.loading import load_model
    from topl_core.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer(chat=True)
    torch.manual_seed(0)
    labels = {0: "CONTRADICTION", 1: "ENTAILMENT", 2: "NEUTRAL"}
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=3,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        pad_token_id=tok.pad_token_id,
    )
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path / "nli")
    tok.save_pretrained(tmp_path / "nli")
    nli = HubScorer(str(tmp_path / "nli"), "nli", chunk_words=8)
    assert nli._positive == 1 and nli.name.startswith("hub:nli:")
    doc = DOC
    claims = ["Police arrested two men.", "Stock was taken."]
    got = nli.score(doc, claims)
    assert len(got) == 2 and all(0 <= x <= 1 for x in got)
    per_chunk = [nli.score(chunk, claims) for chunk in _word_chunks(doc, 8)]
    np.testing.assert_allclose(got, np.max(per_chunk, axis=0), rtol=1e-5)

    lm = load_model("tiny-llama")
    lm.model.save_pretrained(tmp_path / "lm")
    lm.tokenizer.save_pretrained(tmp_path / "lm")
    mc = HubScorer(str(tmp_path / "lm"), "minicheck-lm", chunk_words=400)
    out = mc.score(doc, claims)
    assert len(out) == 2 and all(0 <= x <= 1 for x in out)
    assert score_summary(mc, doc, " ".join(claims), "sentence").score == pytest.approx(np.mean(out), rel=1e-5)
