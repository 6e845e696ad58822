"""The translation task end to end on hand-made MLQE-PE-shaped data and a tiny model: the loader keeps the
post-edits and the pair, the prompt names both languages, TOPL trains on the word tags, base and merged models
translate ID (MLQE-PE test) and OOD (parallel files, FLORES layout) sentences, and chrF scores them."""

from __future__ import annotations

import json

import pytest
from conftest import MLQE_PAIRS, tiny_config, write_mlqe

from topl_core.analysis.evaluation import translation
from topl_core.analysis.evaluation.translation import ChrfScorer, flores_pairs, make_translation_scorer, parallel_pairs
from topl_core.data.mlqe import load_mlqe_dir
from topl_core.foundations.errors import DataError, ScorerError


@pytest.fixture(scope="module")
def mlqe(tmp_path_factory):
    return write_mlqe(tmp_path_factory.mktemp("mlqe") / "en-de")


def test_the_loader_keeps_post_edits_and_pair_and_the_prompt_names_both_languages(mlqe):
    from topl_core.data.encode import encode_record
    from topl_core.models.loading import load_model

    records = load_mlqe_dir(mlqe / "test", "test")
    assert [r.meta for r in records[:2]] == [
        {"lang_pair": "en-de", "reference": "Das Haus ist klein."},
        {"lang_pair": "en-de", "reference": "Die Katze schläft."},
    ]
    assert records[1].bad_texts == ["Hund"] and records[1].task == "translation"
    tok = load_model("tiny-gemma3").tokenizer  # no chat template: the plain prompt is readable text
    enc = encode_record(tok, records[1])
    prompt = tok.decode(enc.input_ids[: enc.response_start])
    assert "Translate the following English sentence into German." in prompt and "Sentence:\nThe cat sleeps." in prompt


def test_chrf_is_one_for_the_reference_and_low_for_unrelated_text():
    scores = ChrfScorer().score(["x"] * 3, ["Das Haus ist klein.", "Zebra Quark", ""], ["Das Haus ist klein."] * 3)
    assert scores[0] == pytest.approx(1.0) and scores[1] < 0.15 and scores[2] == 0.0
    with pytest.raises(ScorerError, match="chrf"):
        make_translation_scorer("bleu")
    with pytest.raises(ScorerError, match="unbabel-comet"):  # the package is not installed here
        make_translation_scorer("comet:Unbabel/wmt22-comet-da").score(["a"], ["b"], ["c"])


def test_the_scorer_agrees_with_mlqe_pe_human_effort(mlqe):
    """chrF of MLQE-PE's own translations against their post-edits ranks them as 1 − HTER does (ties apart)."""
    from scipy.stats import spearmanr

    from topl_core.analysis.evaluation.translation import scorer_agreement

    agreement = scorer_agreement(mlqe / "test", "test")
    chrf = ChrfScorer().score([p[0] for p in MLQE_PAIRS], [p[1] for p in MLQE_PAIRS], [p[2] for p in MLQE_PAIRS])
    assert agreement["n"] == len(MLQE_PAIRS) and agreement["scorer"] == "chrf"
    assert agreement["spearman"] == pytest.approx(spearmanr(chrf, [1 - p[4] for p in MLQE_PAIRS]).statistic)
    assert agreement["spearman"] > 0.8  # the unchanged translations score 1, the most edited lowest


def test_parallel_and_flores_files_and_their_errors(mlqe, tmp_path):
    import shutil

    flores = tmp_path / "flores" / "devtest"
    flores.mkdir(parents=True)
    (flores / "eng_Latn.devtest").write_text("The dog runs.\nIt rains.\n", encoding="utf-8")
    (flores / "deu_Latn.devtest").write_text("Der Hund rennt.\nEs regnet.\n", encoding="utf-8")
    both = [("The dog runs.", "Der Hund rennt."), ("It rains.", "Es regnet.")]
    assert flores_pairs(str(tmp_path / "flores"), "en-de") == both
    assert flores_pairs(str(tmp_path / "flores"), "en-de", n=1) == both[:1]
    with pytest.raises(DataError, match="no FLORES\\+ code for language 'xx'"):
        flores_pairs(str(tmp_path / "flores"), "en-xx")
    (flores / "deu_Latn.devtest").write_text("Der Hund rennt.\n", encoding="utf-8")
    with pytest.raises(DataError, match="eng_Latn.devtest has 2 lines, .*deu_Latn.devtest 1"):
        parallel_pairs(flores / "eng_Latn.devtest", flores / "deu_Latn.devtest")
    without_pe = tmp_path / "en-de" / "test"
    shutil.copytree(mlqe / "test", without_pe)
    (without_pe / "test.pe").unlink()
    with pytest.raises(DataError, match="no test.pe"):
        translation.mlqe_pairs(without_pe, "test")
    assert translation.mlqe_pairs(mlqe / "test", "test", n=2) == [
        ("The house is small.", "Das Haus ist klein."),
        ("The cat sleeps.", "Die Katze schläft."),
    ]


def test_train_on_word_tags_then_translate_and_score_end_to_end(mlqe, tmp_path, monkeypatch, capsys):
    from topl_core.cli import main
    from topl_core.data.records import write_jsonl
    from topl_core.training.trainer import train

    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(load_mlqe_dir(mlqe / "train", "train"), tmp_path / "mlqe-train.jsonl")
    run = train(tiny_config(data=str(data), steps=2), tmp_path / "topl-mt")
    assert run.read_status()["state"] == "finished" and run.load_head() is not None
    ood_src, ood_ref = tmp_path / "ood.en", tmp_path / "ood.de"
    ood_src.write_text("The dog runs.\nIt rains.\n", encoding="utf-8")
    ood_ref.write_text("Der Hund rennt.\nEs regnet.\n", encoding="utf-8")
    out = tmp_path / "mt.json"
    args = ["evaluate-mt", "--run", str(run.path), "--lang-pair", "en-de", "--mlqe", str(mlqe / "test"),
            "--ood-src", str(ood_src), "--ood-ref", str(ood_ref), "--n-id", "3", "--max-new-tokens", "6",
            "--json", str(out), "--csv", str(tmp_path / "mt.csv")]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "translation en-de (chrf" in printed and "Spearman ρ with MLQE-PE's 1 − HTER" in printed
    table = {row["variant"]: row for row in json.loads(out.read_text())["table"]}
    assert set(table) == {"base", "merged (topl-mt)"}
    for row in table.values():
        assert (row["n_ID"], row["n_OOD"]) == (3, 2) and 0 <= row["ID"] <= 1 and 0 <= row["OOD"] <= 1

    def no_generation(*a, **k):
        raise AssertionError("translated again although every translation is cached")

    monkeypatch.setattr(translation, "generate", no_generation)
    assert main(args) == 0  # the second table comes from the cache
    assert main(["evaluate-mt", "--run", str(run.path), "--flores", "x", "--ood-src", str(ood_src)]) == 2
