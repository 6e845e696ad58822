"""LoRA sites, LoRA-A capture, separability, UMAP, the analysis cache and the probe CLI — offline, tiny models."""

from __future__ import annotations

import copy
import json
import math
import re

import numpy as np
import pytest
import torch
from conftest import all_hooks

from topl_core.analysis.lora_a.capture import Projections, capture_lora, collect_projections, random_lora_A
from topl_core.data.encode import IGNORE, encode_record
from topl_core.foundations.errors import ModelError
from topl_core.foundations.presets import LORA_MODULES
from topl_core.models.architecture import decoder_layers
from topl_core.models.tiny import build_tiny_model
from topl_core.runtime.sites import Site, input_module, lora_sites, lora_weights, read_lora_weights
from topl_core.training.config import LoraSettings, TrainConfig, tiny_topl_config
from topl_core.training.lora import apply_lora
from topl_core.training.trainer import train

FAMILIES = ("tiny-llama", "tiny-qwen3", "tiny-gemma3")


def peft_model(family: str, layer_start: int = 1, layer_end: int = 2, random_b: bool = True):
    """A tiny model with LoRA on layers [layer_start, layer_end]; B randomised so the adapter changes activations."""
    model, tok = build_tiny_model(family)
    cfg = TrainConfig(model=family, lora=LoraSettings(layer_start=layer_start, layer_end=layer_end), precision="fp32")
    peft = apply_lora(model, cfg).eval()
    if random_b:
        g = torch.Generator().manual_seed(1)
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.data = torch.randn(p.shape, generator=g) * 0.2
    return peft, tok


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, news_records):
    return train(tiny_topl_config(), tmp_path_factory.mktemp("runs") / "topl-probe", records=news_records)


@pytest.fixture()
def cache_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- sites ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_sites_ordered_and_resolvable(family):
    peft, _ = peft_model(family)
    sites = lora_sites(peft)
    assert [(s.layer, s.module) for s in sites] == [(l, m) for l in (1, 2) for m in LORA_MODULES]
    for s in sites:
        assert s.path == f"model.layers.{s.layer}.{'self_attn' if s.module in LORA_MODULES[:4] else 'mlp'}.{s.module}"
        w = lora_weights(peft, s)
        assert w.A.shape == (4, input_module(peft, s).in_features) and w.scaling == 2.0


def test_lora_sites_errors_name_the_fix():
    model, _ = build_tiny_model("tiny-llama")
    with pytest.raises(ModelError, match="holds no LoRA layers.*load_adapter"):
        lora_sites(model)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ModelError, match="does not know architecture GPT2LMHeadModel.*Llama, Qwen3 or Gemma3"):
        lora_sites(gpt2)


def test_read_lora_weights_equals_peft(tiny_run):
    from topl_core.models.loading import load_model
    from topl_core.training.adapters import load_adapter

    peft = load_adapter(load_model("tiny-llama"), tiny_run)
    from_files = read_lora_weights(tiny_run)
    assert list(from_files) == lora_sites(peft)
    for s, w in from_files.items():
        ref = lora_weights(peft, s)
        assert torch.equal(w.A, ref.A) and torch.equal(w.B, ref.B) and w.scaling == ref.scaling
        assert w.B.abs().sum() > 0  # trained: B moved off its zero init


# --- capture -------------------------------------------------------------------------------------------------


def _row_index(proj: Projections) -> dict[tuple[str, int], int]:
    return {(rid, int(pos)): i for i, (rid, pos) in enumerate(zip(proj.record_ids, proj.positions))}


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_equals_manual_projection(family, news_records):
    """Capture (batched, early exit, base-layer pre-hooks) == A·x recomputed per record without the capture code:
    q/k/v from output_hidden_states + the layer's input norm (hook-free); o/gate/up/down from a full forward that
    records the LoRA modules' own inputs and projects them with PEFT's lora_A module."""
    peft, tok = peft_model(family)
    sites = lora_sites(peft)
    recs = news_records[:6]
    before = all_hooks(peft)
    proj = collect_projections(peft, tok, recs, batch_size=3)
    assert all_hooks(peft) == before  # (transformers itself adds output-recording hooks on output_hidden_states)
    rows = _row_index(proj)
    n_expected = 0
    for rec in recs:
        e = encode_record(tok, rec, 320, 128)
        ids = torch.from_numpy(e.input_ids)[None]
        keep = np.flatnonzero(e.labels != IGNORE)
        n_expected += len(keep)
        seen = {}
        handles = [
            peft.base_model.model.get_submodule(s.path).register_forward_pre_hook(
                lambda m, a, key=s.key: seen.__setitem__(key, a[0].detach())
            )
            for s in sites
        ]
        try:
            with torch.no_grad():
                out = peft(input_ids=ids, output_hidden_states=True)
        finally:
            for h in handles:
                h.remove()
        for s in sites:
            module = peft.base_model.model.get_submodule(s.path)
            if s.module in ("q_proj", "k_proj", "v_proj"):
                x = decoder_layers(peft)[s.layer].input_layernorm(out.hidden_states[s.layer])[0]
            else:
                x = seen[s.key][0]
            with torch.no_grad():
                manual = module.lora_A["default"](x).numpy()
            got = np.stack([proj[s][rows[(rec.id, int(p - e.response_start))]] for p in keep])
            np.testing.assert_allclose(got, manual[keep], rtol=1e-4, atol=1e-5, err_msg=f"{family} {s.key}")
    assert proj.n_tokens == n_expected
    labels = np.concatenate([encode_record(tok, r, 320, 128).labels for r in recs])
    assert (proj.labels == 0).sum() == (labels == 0).sum() > 0


def test_capture_stops_after_last_lora_layer():
    peft, tok = peft_model("tiny-llama", 0, 1)
    ran = []
    handles = [
        layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, layer in enumerate(decoder_layers(peft))
    ]
    handles.append(peft.base_model.model.lm_head.register_forward_hook(lambda *a: ran.append("lm_head")))
    try:
        ids = tok("Police arrested two men.", return_tensors="pt")["input_ids"]
        with capture_lora(peft) as cap:
            cap.run(ids, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool))
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1]  # layers 2, 3 and the LM head never ran


def test_capture_works_with_adapter_disabled_and_merged(news_records):
    peft, tok = peft_model("tiny-llama", 0, 2)
    sites = lora_sites(peft)
    A = {s: lora_weights(peft, s).A for s in sites}
    active = collect_projections(peft, tok, news_records[:4])
    with peft.disable_adapter():
        disabled = collect_projections(peft, tok, news_records[:4])
    merged = copy.deepcopy(peft).merge_and_unload()
    from_merged = collect_projections(merged, tok, news_records[:4], weights=A)
    first = Site(0, "q_proj", "model.layers.0.self_attn.q_proj")
    np.testing.assert_allclose(disabled[first], active[first], atol=1e-6)  # layer-0 input does not depend on LoRA
    assert not np.allclose(disabled["L2.down_proj"], active["L2.down_proj"], atol=1e-3)  # adapter off: x differs
    for s in sites:  # merged weights compute the same x as the active adapter
        np.testing.assert_allclose(from_merged[s], active[s], rtol=1e-3, atol=1e-4)


def test_capture_random_control_is_projection_of_same_inputs(news_records):
    peft, tok = peft_model("tiny-qwen3")
    sites = lora_sites(peft)
    R = random_lora_A(sites, 4, {s: input_module(peft, s).in_features for s in sites}, seed=3)
    keep = [s.key for s in sites]
    sets = collect_projections(peft, tok, news_records[:3], controls={"random": R}, keep_inputs=keep)
    for s in sites:
        x = torch.from_numpy(sets["lora"].inputs[s.key])
        np.testing.assert_allclose(sets["random"][s], (x @ R[s].T).numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sets["lora"][s], (x @ lora_weights(peft, s).A.T).numpy(), rtol=1e-5, atol=1e-5)
        bound = 1 / math.sqrt(x.shape[1])
        assert R[s].abs().max() <= bound and R[s].shape == (4, x.shape[1])


def test_no_hooks_remain_after_exception_in_capture():
    peft, tok = peft_model("tiny-gemma3")
    before = all_hooks(peft)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_lora(peft):
            assert all_hooks(peft) == before + len(lora_sites(peft))
            raise RuntimeError("boom")
    assert all_hooks(peft) == before == 2  # the two LoRA layers' dropout-mask draws (training.lora.LayerMasks) alone
    peft.train()
    with pytest.raises(RuntimeError):
        with capture_lora(peft):
            raise RuntimeError("boom")
    assert peft.training and all_hooks(peft) == before  # mode restored too


# --- separability --------------------------------------------------------------------------------------------


def synthetic(n: int = 2000, sep: float = 6.0, seed: int = 0, sites=None) -> Projections:
    rng = np.random.default_rng(seed)
    sites = sites or (
        Site(0, "o_proj", "model.layers.0.self_attn.o_proj"),
        Site(1, "down_proj", "model.layers.1.mlp.down_proj"),
    )
    y = (rng.random(n) < 0.7).astype(np.int8)
    values = {}
    for s in sites:
        X = rng.normal(size=(n, 4)).astype(np.float32)
        X[:, 2] += np.where(y == 1, sep / 2, -sep / 2)  # component 2 separates (larger = good)
        values[s.key] = X
    docs = np.asarray([f"doc{i // 20}" for i in range(n)])
    return Projections(tuple(sites), values, y, docs, np.arange(n) % 20, np.asarray(["t"] * n), docs)


def test_auroc_is_one_on_separable_and_half_on_shuffled():
    from topl_core.analysis.lora_a.separability import separability

    proj = synthetic(sep=40.0)
    sep = separability(proj, "synthetic", n_boot=200)
    for s in sep.scores:
        assert s.cv_auroc == 1.0 and s.component_auroc == 1.0 and s.component == 2 and s.sign == 1
    assert sep.mean == 1.0 and sep.std == 0.0 and sep.n_good + sep.n_bad == 2000
    flipped = Projections(
        proj.sites,
        {k: -v for k, v in proj.values.items()},
        proj.labels,
        proj.record_ids,
        proj.positions,
        proj.tokens,
        proj.doc_ids,
    )
    assert all(s.sign == -1 and s.component_auroc == 1.0 for s in separability(flipped, n_boot=10).scores)

    shuffled = Projections(
        proj.sites,
        proj.values,
        np.random.default_rng(1).permutation(proj.labels),
        proj.record_ids,
        proj.positions,
        proj.tokens,
        proj.doc_ids,
    )
    noise = separability(shuffled, n_boot=200)
    for s in noise.scores:
        assert abs(s.cv_auroc - 0.5) < 0.06, s
        assert 0.5 <= s.component_auroc < 0.56  # in-sample max over 4 components: a little above 0.5


def test_fast_logistic_and_rank_auroc_agree_with_sklearn():
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from topl_core.analysis.lora_a.separability import fit_logistic, rank_auroc
    from topl_core.foundations.metrics import auroc

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 4)) * [1, 10, 0.1, 3] + [0, 5, 0, -2]
    y = (X[:, 0] + 0.1 * X[:, 1] + rng.normal(size=500) > 0.5).astype(int)
    w, b, mean, scale = fit_logistic(X, y)
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(StandardScaler().fit_transform(X), y)
    np.testing.assert_allclose(w, ref.coef_[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b, ref.intercept_[0], rtol=1e-4, atol=1e-6)
    s = np.round(X[:, 0], 1)  # with ties
    assert rank_auroc(y, s) == pytest.approx(auroc(y, s), abs=1e-12)
    assert math.isnan(rank_auroc(np.ones(5), np.arange(5)))


def test_heatmap_ci_and_comparison_table():
    from topl_core.analysis.lora_a.separability import Separability, comparison_table, format_heatmap, separability

    proj = synthetic(sep=1.0)
    sep = separability(proj, "topl", n_boot=300, num_layers=3)
    hm = sep.heatmap()
    assert hm.shape == (3, 7) and list(hm.columns) == list(LORA_MODULES)
    assert hm.loc[0, "o_proj"] == sep.by_key()["L0.o_proj"].cv_auroc and math.isnan(hm.loc[2, "q_proj"])
    assert sep.ci_low <= sep.mean <= sep.ci_high
    assert "layer" in format_heatmap(hm) and "-" in format_heatmap(hm)
    assert Separability.from_json(json.loads(json.dumps(sep.to_json()))) == sep
    table = comparison_table({"topl": sep, "sft": sep}, {"topl": 0.8}, control=sep)
    assert list(table["method"]) == ["topl", "sft", "random-init A (control)"]
    assert table.loc[0, "ood_factuality"] == 0.8 and math.isnan(table.loc[1, "ood_factuality"])
    assert table.loc[0, "lora_a_auroc"] == f"{sep.mean:.3f} ± {sep.std:.3f}"


def test_umap_embedding_frame():
    from topl_core.analysis.lora_a.umap_view import umap_embedding

    proj = synthetic(n=300, sep=8.0)
    df = umap_embedding(proj, "L0.o_proj", n_neighbors=10)
    assert list(df.columns) == ["x", "y", "label", "token", "record_id", "position"] and len(df) == 300
    assert np.isfinite(df[["x", "y"]].to_numpy()).all()
    # well-separated labels land in different regions: the centroids are far apart relative to the spread
    c1, c0 = df[df.label == 1][["x", "y"]].mean(), df[df.label == 0][["x", "y"]].mean()
    assert np.linalg.norm(c1 - c0) > df[["x", "y"]].std().mean()
    with pytest.raises(ValueError, match="keep_inputs"):
        umap_embedding(proj, "L0.o_proj", source="hidden")


# --- cache ---------------------------------------------------------------------------------------------------


def test_cache_round_trips_exactly(cache_tmp):
    import pandas as pd

    from topl_core.analysis.cache import JSON, NPZ, PARQUET, cache_path, cached, full_key

    calls = []

    def compute(value):
        def f():
            calls.append(1)
            return value

        return f

    j = {"a": [0.1 + 0.2, 1e-300, float("nan")], "b": "x"}
    arrays = {"v": np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32), "s": np.asarray(["a", "bé"])}
    df = pd.DataFrame({"x": [0.1, 0.2], "m": ["q", "k"]})
    for codec, value in ((JSON, j), (NPZ, arrays), (PARQUET, df)):
        first = cached("unit", {"codec": codec.suffix}, compute(value), codec)
        again = cached("unit", {"codec": codec.suffix}, compute(value), codec)
        if codec is JSON:
            assert again["a"][:2] == j["a"][:2] and math.isnan(again["a"][2]) and again["b"] == "x"
        elif codec is NPZ:
            assert all(np.array_equal(again[k], arrays[k]) and again[k].dtype == arrays[k].dtype for k in arrays)
        else:
            pd.testing.assert_frame_equal(again, df)
        assert first is value
        assert cache_path("unit", full_key({"codec": codec.suffix}), codec).exists()
    assert len(calls) == 3  # every second call was a cache hit
    assert not list(cache_tmp.rglob("*.tmp"))
    with pytest.raises(TypeError, match="pickle"):
        cached("unit", {"obj": 1}, lambda: {"o": np.asarray([{}], dtype=object)}, NPZ)


def test_shipped_cache_is_read_after_the_local_one_and_never_written(cache_tmp, tmp_path, monkeypatch):
    """Results shipped beside the demo adapters (examples/analysis-cache) answer a local miss; a local entry wins;
    with the demos hidden (TOPL_EXAMPLES_DIR empty) the shipped cache is not consulted."""
    import shutil

    from topl_core.analysis.cache import JSON, cache_path, cached, full_key, shipped_cache_path

    monkeypatch.setenv("TOPL_EXAMPLES_DIR", str(tmp_path / "examples" / "adapters"))
    local = cache_path("unit", full_key({"q": 1}), JSON)
    shipped = shipped_cache_path(local)
    assert shipped == tmp_path / "examples" / "analysis-cache" / "unit" / local.name
    _write_entry(shipped, "unit", full_key({"q": 1}), '{"from": "shipped"}')

    def must_not_run():
        raise AssertionError("computed although a shipped entry exists")

    assert cached("unit", {"q": 1}, must_not_run) == {"from": "shipped"}
    assert not local.exists()  # read-only: nothing copied, nothing rewritten
    _write_entry(local, "unit", full_key({"q": 1}), '{"from": "local"}')
    assert cached("unit", {"q": 1}, must_not_run) == {"from": "local"}
    local.unlink()
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", "")
    assert cached("unit", {"q": 1}, lambda: {"from": "computed"}) == {"from": "computed"}
    shutil.rmtree(tmp_path / "examples")


def _write_entry(path, kind: str, kd: dict, text: str) -> None:
    """A cache entry and its key file (kind, key, checksum) as `cached` writes them."""
    from topl_core.analysis.cache import key_file
    from topl_core.foundations.io import sha256_file, write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    write_json(key_file(path), {"kind": kind, **kd, "sha256": sha256_file(path)})


def test_a_tampered_cache_entry_is_recomputed_never_trusted(cache_tmp):
    """An entry edited into other valid JSON, an entry whose key file was cut off (a kill between the two writes),
    and another key's entry copied over with its key file: each is recomputed and rewritten, then hit again."""
    import shutil

    from topl_core.analysis.cache import JSON, cache_path, cached, full_key, key_file

    def value(q):
        return lambda: {"q": q}

    path = cache_path("unit", full_key({"q": 1}), JSON)
    tampers = {
        "edited": lambda: path.write_text('{"q": 666}'),
        "key file lost": lambda: key_file(path).unlink(),
        "other entry copied in": lambda: (
            shutil.copy(other, path),
            shutil.copy(key_file(other), key_file(path)),
        ),
    }
    cached("unit", {"q": 2}, value(2))
    other = cache_path("unit", full_key({"q": 2}), JSON)
    for name, tamper in tampers.items():
        cached("unit", {"q": 1}, value(1))
        tamper()
        calls = []
        with pytest.warns(RuntimeWarning, match=rf"{re.escape(str(path))}: unusable .*computed again"):  # said
            assert cached("unit", {"q": 1}, lambda: calls.append(1) or {"q": 1}) == {"q": 1}, name
        assert calls == [1], name
        assert cached("unit", {"q": 1}, lambda: calls.append(1) or {"q": 1}) == {"q": 1} and calls == [1], name


def test_probe_is_cached_and_invalidated_by_a_changed_adapter(cache_tmp, tiny_run, news_records, tmp_path):
    import shutil

    from topl_core.analysis.lora_a.probe import ProbeSettings, probe_run, run_projections
    from topl_core.training.run_dirs import RunDir

    settings = ProbeSettings(n_boot=50)
    res = probe_run(tiny_run, news_records, settings, token_set="tiny")
    assert len(res.lora.scores) == 4 * 7 and res.control is not None and res.lora.num_layers == 4
    assert res.lora.n_bad > 0 and 0 <= res.lora.mean <= 1
    n_files = len(list(cache_tmp.rglob("*")))
    again = probe_run(tiny_run, news_records, settings, token_set="tiny")
    assert again == res and len(list(cache_tmp.rglob("*"))) == n_files  # exact reload, nothing recomputed
    proj = run_projections(tiny_run, news_records, settings)
    assert set(proj) == {"lora", "random"} and proj["lora"].n_tokens == res.lora.n_tokens

    other = probe_run(tiny_run, news_records, ProbeSettings(n_boot=50, seed=1))  # changed config → new entry
    assert len(list(cache_tmp.rglob("lora_separability/*.json"))) == 4  # 2 results + 2 key files

    copy_dir = tmp_path / "changed"
    shutil.copytree(tiny_run.path, copy_dir)
    from safetensors.torch import load_file, save_file

    t = load_file(copy_dir / "adapter_model.safetensors")
    name = next(k for k in t if "lora_B" in k and "layers.3.mlp.down_proj" in k)
    t[name] = t[name] + 0.5
    save_file(t, copy_dir / "adapter_model.safetensors")
    changed = RunDir(copy_dir)
    changed.record_checksums()  # a deliberate change (the load would refuse an unrecorded one)
    assert changed.fingerprint() != tiny_run.fingerprint()
    res2 = probe_run(changed, news_records, settings)
    assert res2.adapter_fingerprint == changed.fingerprint() != res.adapter_fingerprint
    assert len(list(cache_tmp.rglob("lora_projections/*.npz"))) == 2  # recaptured for the changed adapter
    assert other.lora.scores != () and res2.lora.scores != ()


def test_probe_cli_writes_json_and_prints_heatmap(cache_tmp, tiny_run, news_records, tmp_path, capsys):
    from topl_core.cli import main
    from topl_core.data.records import write_jsonl

    data = write_jsonl(news_records, tmp_path / "recs.jsonl")
    out = tmp_path / "probe.json"
    rc = main(
        [
            "probe",
            "--run",
            str(tiny_run.path),
            "--data",
            str(data),
            "--split",
            "all",
            "--random-control",
            "--compare",
            str(tiny_run.path),
            "--json",
            str(out),
            "--n-boot",
            "50",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mean ± std" in printed and "random-init A" in printed and "layer" in printed
    report = json.loads(out.read_text())
    first = report["results"][0]
    assert first["lora"]["mean"] == pytest.approx(np.mean([s["cv_auroc"] for s in first["lora"]["scores"]]))
    assert len(report["comparison"]) == 3


def test_the_indicator_table_puts_lora_a_beside_id_and_ood_factuality(
    cache_tmp, tiny_run, news_records, tmp_path, monkeypatch
):
    """The paper's indicator table from three adapters: LoRA-A mean per adapter and the random-A row, each merged
    model's ID / OOD factuality and sentence count from a real generation, and ρ equal to scipy's Spearman of those
    columns; below three adapters ρ is NaN. A second table comes from the cache (no generation)."""
    import pandas as pd
    from scipy.stats import spearmanr

    from topl_core.analysis.evaluation import evaluate as evaluation
    from topl_core.analysis.evaluation.config import EvalConfig
    from topl_core.analysis.evaluation.indicator import factuality_by_adapter, indicator_table
    from topl_core.analysis.lora_a.probe import ProbeSettings, labelled_records, probe_run

    others = {
        method: train(
            TrainConfig(
                model="tiny-llama",
                method=method,
                lora=LoraSettings(layer_start=0, layer_end=3),
                steps=2,
                lr=5e-3,
                precision="fp32",
                batch_size=4,
            ),
            tmp_path / method,
            records=news_records,
        )
        for method in ("sft", "unlikelihood")
    }
    adapters = {"topl": tiny_run.path, **{m: r.path for m, r in others.items()}}
    settings = ProbeSettings(n_boot=20, random_control=True)
    probes = {name: probe_run(path, labelled_records(news_records), settings) for name, path in adapters.items()}
    ood = tmp_path / "ood.csv"
    pd.DataFrame({"doc": [r.document for r in news_records[:2]], "origin": "xsum", "id": ["1", "2"]}).to_csv(
        ood, index=False
    )
    cfg = EvalConfig(n_id=2, n_ood=2, cliff_csv=str(ood), max_new_tokens=8, model="tiny-llama")
    factuality = factuality_by_adapter(adapters, cfg)
    table, rho = indicator_table({n: p.lora for n, p in probes.items()}, factuality, probes["topl"].control)
    assert list(table["method"]) == ["topl", "sft", "unlikelihood", "random-init A (control)"]
    rows = table.iloc[:3]
    assert rows["id_factuality"].between(0, 1).all() and rows["ood_factuality"].between(0, 1).all()
    assert (rows["sentences"] >= 0).all() and table.iloc[3][["id_factuality", "ood_factuality"]].isna().all()
    assert list(rows["mean"]) == [probes[n].lora.mean for n in adapters]
    for column in ("ood_factuality", "id_factuality"):
        expected = spearmanr(rows["mean"], rows[column]).statistic
        assert rho[column] == pytest.approx(expected, nan_ok=True)
    _, two = indicator_table({n: probes[n].lora for n in ("topl", "sft")}, factuality)
    assert math.isnan(two["ood_factuality"])

    def no_generation(*a, **k):
        raise AssertionError("generated again although every summary is cached")

    monkeypatch.setattr(evaluation, "generate", no_generation)
    assert factuality_by_adapter(adapters, cfg).equals(factuality)


def test_probe_cli_evaluate_adds_factuality_and_refuses_a_hand_given_score(cache_tmp, tiny_run, news_records, tmp_path):
    from topl_core.cli import main
    from topl_core.data.records import write_jsonl

    data = write_jsonl(news_records, tmp_path / "recs.jsonl")
    out = tmp_path / "indicator.json"
    common = ["probe", "--run", str(tiny_run.path), "--data", str(data), "--split", "all", "--n-boot", "20"]
    evaluate = ["--evaluate", "--n-id", "1", "--n-ood", "0", "--max-new-tokens", "4"]
    assert main([*common, *evaluate, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["spearman"]) == {"ood_factuality", "id_factuality"}  # NaN: one adapter
    assert 0 <= report["comparison"][0]["id_factuality"] <= 1
    assert main([*common, *evaluate, "--ood-score", "topl-probe=0.5"]) == 2


def test_run_umap_is_cached(cache_tmp, tiny_run, news_records):
    from topl_core.analysis.lora_a.umap_view import run_umap

    df = run_umap(tiny_run, news_records, "L3.down_proj", n_neighbors=5)
    hidden = run_umap(tiny_run, news_records, "L1.q_proj", source="hidden", n_neighbors=5)
    assert len(df) == len(hidden) > 0 and set(df.label) == {0, 1}
    again = run_umap(tiny_run, news_records, "L3.down_proj", n_neighbors=5)
    import pandas as pd

    pd.testing.assert_frame_equal(again, df)
    assert len(list(cache_tmp.rglob("umap/*.parquet"))) == 2
