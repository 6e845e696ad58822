"""The ablation action (actions.AblateDirection, mode "ablate"): output − λ · (output · d̂) d̂ at the steered sites,
added as one action in actions.py. Its formula on the tiny model's site outputs, the merged model at λ = 0, and the
mode reaching the CLI, the λ study and the Steering, Talk and Evaluation pages (every mode in bf16 and the λ grid as
one batch: tests/test_bf16.py, tests/test_steering.py)."""

from __future__ import annotations

import json
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from conftest import NEWS_PAIRS, all_hooks, tiny_config

from topl_core.analysis.steering.extract import build_steering_vectors
from topl_core.inference.generate import GenerationConfig, generate, load_merged
from topl_core.runtime.modes import MODES, SteerConfig, steer
from topl_core.runtime.session import SteeringSession
from topl_core.runtime.sites import site_module
from topl_core.training.trainer import train

DOC = NEWS_PAIRS[0][1]
ABLATE = SteerConfig("ablate")


@pytest.fixture(scope="module")
def run(tmp_path_factory, news_records):
    cfg = tiny_config(steps=3, lr=5e-3, precision="fp32", batch_size=4, max_val_examples=4, eval_every=3)
    return train(cfg, tmp_path_factory.mktemp("runs") / "topl-ablate", records=news_records)


@pytest.fixture(scope="module")
def vectors(run, news_records):
    return build_steering_vectors(run, news_records, top_k=3, use_cache=False)


@pytest.fixture(scope="module")
def merged(run):
    return load_merged("tiny-llama", run)


def site_outputs(model, vectors, enc, lam=None) -> dict[str, torch.Tensor]:
    """Each steered site's output in one forward: steered with λ when given (the capture hooks, registered after
    steer's, see the steered outputs)."""
    seen: dict[str, torch.Tensor] = {}
    with torch.no_grad(), steer(model, vectors, lam, ABLATE) if lam is not None else nullcontext():
        handles = [
            site_module(model, s).register_forward_hook(lambda _m, _i, out, k=s.key: seen.__setitem__(k, out.detach()))
            for s in vectors.sites
        ]
        try:
            model(**enc)
        finally:
            for h in handles:
                h.remove()
    return seen


def unit_direction(vectors, key: str) -> torch.Tensor:
    d = torch.from_numpy(vectors.vectors[key]).double()
    return d / d.norm()


def test_ablation_removes_the_share_lambda_of_the_component(merged, vectors):
    """λ = 1 leaves no component along the LoRA-B direction at any steered site; at the first steered site (whose
    input the steering does not change) λ keeps 1 − λ of the component and leaves the orthogonal part untouched. A λ
    per batch row steers each row as that λ alone does."""
    model = merged.model
    enc = merged.tokenizer(DOC, return_tensors="pt")
    hooks = all_hooks(model)
    plain = site_outputs(model, vectors, enc)
    for s, out in site_outputs(model, vectors, enc, 1.0).items():
        d = unit_direction(vectors, s)
        assert (out.double() @ d).abs().max() < 1e-4 * out.double().norm(dim=-1).max()
    first = min(vectors.sites, key=lambda s: s.layer).key
    d = unit_direction(vectors, first)
    before = plain[first].double()
    for lam in (0.5, -1.0, 2.0):
        after = site_outputs(model, vectors, enc, lam)[first].double()
        torch.testing.assert_close(after @ d, (1 - lam) * (before @ d), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(after - (after @ d)[..., None] * d, before - (before @ d)[..., None] * d)
    rows = {k: v.repeat(3, 1) for k, v in enc.items()}
    per_row = site_outputs(model, vectors, rows, [0.0, 1.0, -1.0])
    for r, lam in enumerate((0.0, 1.0, -1.0)):
        alone = site_outputs(model, vectors, enc, lam)
        for k in alone:
            torch.testing.assert_close(per_row[k][r], alone[k][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(site_outputs(model, vectors, enc, 0.0)[first], plain[first], rtol=0, atol=0)
    assert all_hooks(model) == hooks


def test_ablation_at_zero_is_the_merged_model_and_moves_the_text_elsewhere(merged, vectors):
    """λ = 0 generates the merged model's text token for token; a large λ changes it; the hooks are gone after."""
    session, hooks = SteeringSession(merged, vectors), all_hooks(merged.model)
    gen = GenerationConfig(max_new_tokens=10, precision="fp32")
    merged_text = generate(merged, [DOC], gen)[0]
    assert ABLATE.neutral == 0.0
    assert session.generate_steered(DOC, 0.0, gen, how=ABLATE) == merged_text
    texts = session.generate_grid(DOC, [0.0, 50.0, -50.0], gen, how=ABLATE)
    assert texts[0] == merged_text and len(set(texts)) > 1
    assert all_hooks(merged.model) == hooks
    assert "share" in ABLATE.caption and MODES["ablate"].action.unit_note(vectors, MODES["ablate"], "raw") is None


def test_ablation_reaches_the_cli_and_the_lambda_study(run, news_records, tmp_path, monkeypatch, capsys):
    from topl_core.analysis.evaluation.config import EvalConfig, Variant
    from topl_core.analysis.evaluation.evaluate import evaluate
    from topl_core.analysis.evaluation.lambda_study import lambda_sweep
    from topl_core.cli import main
    from topl_core.data.records import write_jsonl

    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    data = write_jsonl(news_records, tmp_path / "news.jsonl")
    out = tmp_path / "steer.json"
    rc = main(["steer", "--run", str(run.path), "--document", DOC, "--mode", "ablate", "--lambdas", "0", "1",
               "--data", str(data), "--split", "all", "--max-new-tokens", "6", "--no-base",
               "--json", str(out)])  # fmt: skip
    assert rc == 0 and "λ = 1 (ablate (all positions))" in capsys.readouterr().out
    assert [g["model"] for g in json.loads(out.read_text())["generations"]] == ["merged", "steered"]

    cfg = EvalConfig(data=str(data), n_id=2, n_ood=0, max_new_tokens=5, max_doc_tokens=64, precision="fp32")
    df = lambda_sweep(run.path, [0.0, 1.0], cfg, modes=("ablate",), grids={"ablate": [0.0, 1.0]})
    assert set(df["mode"]) == {"ablate"} and sorted(df["lambda"].unique()) == [0.0, 1.0]
    merged_texts = evaluate([Variant.merged(run.path)], cfg, measure_quality=False).per_doc["text"].tolist()
    assert df[df["lambda"] == 0.0]["text"].tolist() == merged_texts


def test_ablation_reaches_the_pages(tmp_path_factory, tiny_records, monkeypatch):
    """The Steering page steers with it on its own λ axis; Talk and Evaluation offer it."""
    from test_app import build_workbench, html_boxes, open_page

    wb = build_workbench(tmp_path_factory.mktemp("workbench"), tiny_records)
    for k, v in wb["env"].items():
        monkeypatch.setenv(k, v)
    at = open_page("steering")
    at.selectbox(key="steer.run").set_value(str(wb["runs"] / "topl-tiny")).run()
    label = MODES["ablate"].label
    assert label in at.radio(key="steer.mode").options
    at.radio(key="steer.mode").set_value("ablate").run()
    assert not at.exception and at.slider(key="steer.lambda.ablation").value == 0.0
    at.slider(key="steer.lambda.ablation").set_value(1.0).run()
    assert not at.exception and "λ = +1.00" in html_boxes(at)[2]

    at = open_page("talk")
    at.selectbox(key="talk.run").set_value(str(wb["runs"] / "topl-tiny")).run()
    assert label in at.radio(key="talk.mode").options
    at = open_page("evaluation")
    at.radio(key="eval.mode").set_value("λ sweep (steering study)").run()
    assert not at.exception and label in at.multiselect(key="eval.modes").options
    assert np.isfinite(MODES["ablate"].slider_positions()).all()
