"""Detection transfer (analysis/transfer.py and the `transfer` command) on tiny models: dev and held-out sets never
share a document, CLIFF is read by its cut; the record bootstrap's CI; the frozen probe scores the base model's own
states; every held-out evaluation is logged, a cache hit included; the command runs end to end."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from peft import LoraConfig, get_peft_model

from topl_core.analysis.studies import transfer
from topl_core.analysis.studies.detection_stats import DETECTORS, bootstrap_auroc
from topl_core.analysis.studies.layer_scan import _features_by_layer, layer_scan
from topl_core.analysis.studies.transfer import (
    COLUMNS,
    TransferSettings,
    detection_scorer,
    evaluation_sets,
    format_markdown,
    heldout_log_path,
    load_cliff,
    training_records,
    transfer_table,
)
from topl_core.cli import main
from topl_core.data.encode import encode_record
from topl_core.data.records import Record, write_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.errors import ConfigError, DataError
from topl_core.foundations.io import read_log_rows
from topl_core.foundations.metrics import auroc, weighted_aurocs
from topl_core.models.forward import head_features
from topl_core.models.loading import load_model
from topl_core.training.adapters import load_adapter, open_adapter

CLIFF_COLUMNS = ["dataset", "origin", "id", "doc", "summ", "model_name", "cut", "error_type", "annotated_span"]
SMALL = TransferSettings(stage="heldout", max_records_per_set=4, probe_records=16, bootstrap=50)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """A fresh analysis cache (and held-out log) per test, and no default CLIFF file."""
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TOPL_SHARED_DATA", str(tmp_path / "no-shared"))


def write_cliff(path, n: int = 6):
    """A CLIFF-format CSV: per origin, n articles alternating cut val / test, half with one annotated error."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, CLIFF_COLUMNS)
        w.writeheader()
        for origin in ("xsum", "cnndm"):
            for i in range(n):
                bad = i % 4 < 2
                w.writerow(
                    dict(
                        dataset="CLIFF",
                        origin=origin,
                        id=str(100 + i),
                        doc=f"The council approved the new budget on Monday. Police arrested {i + 2} men in London.",
                        summ=f"The council approved the budget on {'Friday' if bad else 'Monday'}. Police arrested "
                        f"{i + 2} men.",
                        model_name="BART",
                        cut="val" if i % 2 == 0 else "test",
                        error_type="['extrinsic-NP']" if bad else "correct",
                        annotated_span="['Friday']" if bad else "",
                    )
                )
    return path


@pytest.fixture(scope="module")
def peft_folder(tmp_path_factory):
    """A plain PEFT adapter (no head) on tiny-llama with random, non-zero A and B on layers 0–2."""
    torch.manual_seed(0)
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "o_proj"],
        layers_to_transform=[0, 1, 2],
        init_lora_weights=False,
    )
    model = get_peft_model(load_model("tiny-llama").model, cfg)
    model.peft_config["default"].base_model_name_or_path = "tiny-llama"
    path = tmp_path_factory.mktemp("peft") / "pf"
    model.save_pretrained(path)
    return path


def test_bootstrap_ci_holds_the_point_narrows_with_records_and_resamples_records():
    rng = np.random.default_rng(0)

    def synthetic(n_records: int, record_effect: float = 0.0):
        """20 tokens per record, 30% bad; a bad token's score is raised by 1 (± record_effect per record)."""
        groups = np.repeat(np.arange(n_records), 20)
        bad = rng.random(len(groups)) < 0.3
        lift = 1 + record_effect * rng.normal(0, 1, n_records)
        return bad, {"s": bad * lift[groups] + rng.normal(0, 1, len(groups))}, groups

    few = bootstrap_auroc(*synthetic(20), n=200)["s"]
    many = bootstrap_auroc(*synthetic(200), n=200)["s"]
    for ci in (few, many):
        assert ci.ci_low <= ci.auroc <= ci.ci_high
    assert many.ci_high - many.ci_low < (few.ci_high - few.ci_low) / 2
    # how well bad tokens stand out varies by record: resampling records gives a wider CI than resampling tokens
    bad, scores, groups = synthetic(30, record_effect=1.5)
    clustered = bootstrap_auroc(bad, scores, groups, n=300)["s"]
    naive = bootstrap_auroc(bad, scores, np.arange(len(bad)), n=300)["s"]
    assert clustered.auroc == naive.auroc
    assert clustered.ci_high - clustered.ci_low > 1.5 * (naive.ci_high - naive.ci_low)
    # perfectly separating scores: AUROC 1, CI [1, 1]; the same seed gives the same CI
    perfect = bootstrap_auroc(bad, {"s": bad.astype(float), "t": scores["s"]}, groups, n=100, seed=3)
    assert tuple(perfect["s"]) == (1.0, 1.0, 1.0)
    assert perfect["t"] == bootstrap_auroc(bad, {"t": scores["s"]}, groups, n=100, seed=3)["t"]
    assert np.isnan(bootstrap_auroc(bad, scores, groups, n=0)["s"].ci_low)


def test_weighted_aurocs_equal_auroc_on_the_repeated_items():
    """A bootstrap resample as weights gives the AUROC of the resampled arrays themselves, ties included."""
    rng = np.random.default_rng(1)
    bad = rng.random(400) < 0.2
    scores = np.round(rng.normal(size=400) + bad, 1)  # rounded: many ties
    weights = rng.integers(0, 3, size=(20, 400))
    weights[0] = 0
    weights[0, ~bad] = 1  # only good tokens: undefined
    expected = [auroc(np.repeat(bad, w), np.repeat(scores, w)) for w in weights]
    np.testing.assert_allclose(weighted_aurocs(bad, scores, weights), expected, atol=1e-12)
    assert np.isnan(weighted_aurocs(bad, scores, weights)[0])


def test_dev_and_heldout_sets_share_no_document_and_read_cliff_by_cut(tiny_run, tiny_records, tmp_path):
    adapter = open_adapter(tiny_run)
    cliff, notes = load_cliff(write_cliff(tmp_path / "cliff.csv"))
    assert notes == []
    labelled = training_records(adapter, tiny_records)
    dev = evaluation_sets(adapter, "dev", labelled, cliff, 128)
    held = evaluation_sets(adapter, "heldout", labelled, cliff, 128)
    assert list(dev) == ["halueval-perturbed/val", "cliff-cnndm/val", "cliff-xsum/val"]
    assert list(held) == ["halueval-perturbed/test", "cliff-cnndm/test", "cliff-xsum/test"]

    def docs(sets):
        return {r.doc_id for recs in sets.values() for r in recs}

    train = split_records(labelled, seed=adapter.settings.split_seed)["train"]
    assert docs(dev) and docs(held) and not docs(dev) & docs(held)
    assert not {r.doc_id for r in train} & (docs(dev) | docs(held))
    assert {r.meta["cut"] for name in dev if name.startswith("cliff") for r in dev[name]} == {"val"}
    assert {r.meta["cut"] for name in held if name.startswith("cliff") for r in held[name]} == {"test"}
    # the cap keeps the first records in file order
    capped = evaluation_sets(adapter, "dev", labelled, cliff, 2)
    assert all(capped[name] == dev[name][:2] for name in dev)
    # a merged data file is reported per source, each its documents' split
    own = [replace(r, id=r.id + ":own", source="own-summaries") for r in labelled]
    mixed = evaluation_sets(adapter, "dev", labelled + own, cliff, 128)
    assert list(mixed) == ["halueval-perturbed/val", "own-summaries/val", "cliff-cnndm/val", "cliff-xsum/val"]
    assert [r.doc_id for r in mixed["own-summaries/val"]] == [r.doc_id for r in dev["halueval-perturbed/val"]]


def test_user_mistakes_say_what_to_do(tiny_run, tmp_path):
    with pytest.raises(ConfigError, match="'dev'"):
        TransferSettings(stage="test")
    with pytest.raises(ConfigError, match="bootstrap"):
        TransferSettings(bootstrap=-1)
    unlabelled = [
        Record(id=f"r{i}", document="A doc.", response="A summary.", token_labels_known=False) for i in (1, 2)
    ]
    with pytest.raises(DataError, match="token labels.*data build"):
        training_records(open_adapter(tiny_run), unlabelled)
    with pytest.raises(DataError, match="not found"):
        load_cliff(tmp_path / "missing.csv")
    report, notes = load_cliff(None)  # the default file is absent here: skipped, with the reason
    assert report is None and "CLIFF sets skipped" in notes[0]


def test_frozen_probe_scores_the_base_models_states(peft_folder, tiny_records):
    adapter = open_adapter(peft_folder)
    labelled = training_records(adapter, tiny_records)
    scorer = detection_scorer(adapter, labelled, replace(SMALL, precision="fp32"))
    layer, frozen = scorer.probe_on_base
    assert layer == scorer.head_layer == 2  # the headless adapter's probe head and the control share a layer
    records = [r for r in labelled if r.bad_spans][:3]
    scores = scorer.score(records)
    base = load_model("tiny-llama").model  # a second computation: the base model with no adapter at all
    for rec, s, e in zip(records, scores, scorer.encode(records)):
        ids = torch.from_numpy(e.input_ids)[None]
        mask = torch.ones_like(ids)
        with torch.no_grad():
            on_base = torch.sigmoid(frozen(head_features(base, ids, mask, layer)))[0, e.response_start : e.response_end]
            on_adapter = torch.sigmoid(frozen(head_features(scorer.model, ids, mask, layer)))
        np.testing.assert_allclose(s.p_good_base, on_base.squeeze(-1).numpy(), atol=1e-5)
        on_adapter = on_adapter[0, e.response_start : e.response_end].squeeze(-1).numpy()
        assert np.abs(s.p_good_base - on_adapter).max() > 1e-3  # B ≠ 0: the adapter's states are other states
    assert all(s.p_good_base.shape == s.p_good.shape == s.surprisal.shape for s in scores)


def test_heldout_calls_are_logged_also_from_the_cache_and_dev_calls_are_not(
    tiny_run, tiny_records, tmp_path, monkeypatch
):
    cliff = write_cliff(tmp_path / "cliff.csv")
    name = open_adapter(tiny_run).name
    dev = transfer_table([tiny_run], replace(SMALL, stage="dev"), cliff, tiny_records)
    assert not heldout_log_path().exists() and dev.attrs["heldout_before"] == {name: 0}
    first = transfer_table([tiny_run], SMALL, cliff, tiny_records)
    assert list(first.columns) == COLUMNS and len(first) == 3 * len(DETECTORS)
    assert set(first["set"]) == {"halueval-perturbed/test", "cliff-cnndm/test", "cliff-xsum/test"}
    assert (first["tokens"] > 0).all() and (first["records"] <= SMALL.max_records_per_set).all()
    assert ((first["ci_low"] <= first["auroc"]) & (first["auroc"] <= first["ci_high"])).all()
    for _, rows in first.groupby("set"):  # the three detectors read the same tokens
        assert rows["tokens"].nunique() == rows["records"].nunique() == rows["pct_bad"].nunique() == 1
    (row,) = read_log_rows(heldout_log_path())
    assert row["adapter"] == name and row["fingerprint"] == open_adapter(tiny_run).fingerprint()
    assert set(row["sets"]) == set(first["set"])

    def no_scoring(*_a, **_k):
        raise AssertionError("a cached result was computed again")

    monkeypatch.setattr(transfer, "detection_scorer", no_scoring)
    again = transfer_table([tiny_run], SMALL, cliff, tiny_records)
    pd.testing.assert_frame_equal(first, again)
    assert len(read_log_rows(heldout_log_path())) == 2 and again.attrs["heldout_before"] == {name: 1}
    transfer_table([tiny_run], replace(SMALL, stage="dev"), cliff, tiny_records)  # cached too; not logged
    assert len(read_log_rows(heldout_log_path())) == 2
    assert f"{name}: held-out sets evaluated 1 time(s) before this evaluation" in format_markdown(again)


def test_the_command_prints_the_table_and_the_heldout_warning(tiny_run, peft_folder, tiny_records, tmp_path, capsys):
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    args = ["transfer", "--run", str(tiny_run.path), "--run", str(peft_folder), "--data", str(data)]
    small = ["--max-records", "3", "--probe-records", "16", "--bootstrap", "20"]
    out_csv, out_json = tmp_path / "t.csv", tmp_path / "t.json"
    assert main([*args, *small, "--stage", "heldout", "--csv", str(out_csv), "--json", str(out_json)]) == 0
    out, err = capsys.readouterr()
    assert "do not use them to choose settings" in err and "evaluated 0 time(s) before" in err
    assert "CLIFF sets skipped" in out  # no --cliff and no default file: said under the table
    assert out.startswith("| adapter | stage | set | detector | AUROC [95% CI] |")
    assert out.count("| frozen probe |") == 2 and "pf" in out
    table = pd.read_csv(out_csv)
    assert list(table.columns) == COLUMNS and len(table) == 2 * len(DETECTORS)
    assert len(json.loads(out_json.read_text())["rows"]) == len(table)
    assert len(read_log_rows(heldout_log_path())) == 2  # one line per adapter
    unlabelled = [Record(id="u", document="A doc.", response="A summary.", token_labels_known=False)]
    bad = write_jsonl(unlabelled, tmp_path / "u.jsonl")
    assert main(["transfer", "--run", str(tiny_run.path), "--data", str(bad), "--stage", "dev"]) == 2
    assert "no record has token labels" in capsys.readouterr().err


def test_layer_scan_reads_every_layer_from_one_forward_and_only_dev(peft_folder, tiny_records, tmp_path):
    """The scan's features at layer l are head_features at l (base model, adapter disabled); one AUROC per (layer,
    set); a held-out scan is refused."""
    adapter = open_adapter(peft_folder)
    settings = replace(SMALL, stage="dev")
    lm = load_model("tiny-llama")
    model = load_adapter(lm, adapter)
    records = [r for r in tiny_records if r.token_labels_known][:6]
    with model.disable_adapter():
        features, labels = _features_by_layer(model, lm.tokenizer, records, [0, 2], adapter.settings, settings)
        for layer in (0, 2):
            expected = []
            for r in records:
                e = encode_record(
                    lm.tokenizer, r, adapter.settings.max_doc_tokens, adapter.settings.max_response_tokens
                )
                ids = torch.as_tensor(e.input_ids)[None]
                h = head_features(model, ids, torch.ones_like(ids), layer)[0, e.response_start : e.response_end]
                expected.append(h[torch.tensor(e.response_labels != -100)].numpy())
            np.testing.assert_allclose(features[layer], np.concatenate(expected), atol=1e-4)
    scan = layer_scan(adapter, settings, [0, 1, 2], write_cliff(tmp_path / "c.csv"), records=tiny_records)
    assert sorted(scan.layer.unique()) == [0, 1, 2] and set(scan.set) >= {"cliff-xsum/val", "cliff-cnndm/val"}
    assert scan.auroc.between(0, 1).all()
    with pytest.raises(ConfigError, match="dev"):
        layer_scan(adapter, SMALL, [0], records=tiny_records)
