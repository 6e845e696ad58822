"""The model's own summaries as training records: the lexical labelling rule, exact token labels, the build."""

from __future__ import annotations

import pytest
from test_encode import _check_exact_labels

from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.studies.own_summaries import SOURCE, generate_own_summaries, label_summary, own_summary_records
from topl_core.data.records import read_jsonl, write_jsonl
from topl_core.inference.generate import generate
from topl_core.models.loading import load_model

DOC = (
    "Alice Smith met Bob Jones in Paris on Monday. The company lost 300 jobs after the merger, and three "
    "managers resigned. Jones said the talks would continue."
)


def _bad(summary: str) -> list[tuple[str, str]]:
    labelled = label_summary(DOC, summary)
    return [(labelled.response[s.start : s.end], s.kind) for s in labelled.bad_spans]


@pytest.mark.parametrize(
    "summary, response, bad",
    [
        # an invented name in a supported sentence: only the name is bad
        ("Alice Smith met Carol in Paris.", "Alice Smith met Carol in Paris.", [("Carol", "own-name")]),
        # a number the document lacks is bad; one it has (as digits or as a number word) is not
        ("The company lost 450 jobs.", "The company lost 450 jobs.", [("450", "own-number")]),
        ("The company lost 300 jobs and 3 managers resigned.", None, []),
        # a sentence with a content word the document lacks is left out, bad name and all
        ("Carol celebrated wildly in Paris. Smith met Jones.", "Smith met Jones.", []),
        # a repeated sentence is left out
        ("Smith met Jones. Smith met Jones.", "Smith met Jones.", []),
        # a sentence-initial capital is not a name: "Jones" starts the sentence and is found, "Talks" is a stem
        ("Jones said talks would continue.", None, []),
        # a word whose stem the document lacks ("merged" → "merg"; the document has "merger"): left out
        ("The company merged.", "", []),
        # a last sentence cut mid-way (the generation's token limit) is left out; closing quotes still close one
        ("Smith met Jones. The company lost 300 jobs after the", "Smith met Jones.", []),
        ('Jones said "the talks would continue."', None, []),
        ("Jones said the talks would continue", "", []),
    ],
)
def test_label_rule_on_hand_written_summaries(summary, response, bad):
    labelled = label_summary(DOC, summary)
    assert labelled.response == (summary if response is None else response)
    assert _bad(summary) == bad
    if response == "":
        assert labelled.kept == 0


def test_kept_sentences_keep_exact_spans_and_token_labels():
    summary = "Alice Smith met Carol in Paris on Monday. Officials cheered loudly. The company lost 450 jobs."
    records, report = own_summary_records(
        [{"doc_id": "d1", "document": DOC}, {"doc_id": "d2", "document": DOC}],
        [summary, "Zebras sang."],
        "tiny-llama",
    )
    assert len(records) == 1 and report.records == 1 and report.summaries == 2
    (r,) = records
    assert r.response == "Alice Smith met Carol in Paris on Monday. The company lost 450 jobs."
    assert r.bad_texts == ["Carol", "450"] and r.sequence_label == 0
    assert (r.id, r.doc_id, r.source) == ("d1:own", "d1", SOURCE)
    assert (report.sentences, report.sentences_kept) == (4, 2)
    assert report.spans == {"own-name": 1, "own-number": 1}
    _check_exact_labels(load_model("tiny-llama").tokenizer, r)


def test_generated_summaries_are_the_evaluation_generations_and_cached(tmp_path, monkeypatch, tiny_records):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    rows = [{"doc_id": r.doc_id, "document": r.document} for r in tiny_records[:3]]
    done: list[int] = []
    summaries = generate_own_summaries("tiny-llama", rows, chunk=2, progress=done.append)
    assert done == [2, 3]
    direct = generate(load_model("tiny-llama"), [r["document"] for r in rows], EvalConfig().generation)
    assert summaries == direct
    entries = sorted((tmp_path / "cache").rglob("*.json"))
    assert entries  # one cache entry per chunk, read back on a second build
    assert generate_own_summaries("tiny-llama", rows, chunk=2) == summaries
    assert sorted((tmp_path / "cache").rglob("*.json")) == entries


def test_cli_merge_joins_files_and_refuses_repeated_ids(tmp_path, tiny_records, capsys):
    from topl_core.cli import main

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(tiny_records[:3], a)
    write_jsonl(tiny_records[3:5], b)
    out = tmp_path / "mix.jsonl"
    assert main(["data", "merge", str(a), str(b), "--out", str(out)]) == 0
    assert [r.id for r in read_jsonl(out)] == [r.id for r in tiny_records[:5]]
    assert main(["data", "merge", str(a), str(a), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "occurs more than once" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
