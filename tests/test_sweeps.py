"""Sliding-window layer sweep: forward from a cached intermediate hidden state equals the full forward (Llama, Qwen3,
Gemma3 with sliding/full layers and padding), prefix reuse trains exactly what the plain trainer trains, sweeps
resume without redoing finished windows, and the label-sensitivity study's rows and stats follow data.variants."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from conftest import free_port, tiny_config
from safetensors.torch import load_file

from topl_core.analysis.studies import sweeps
from topl_core.analysis.studies.sweep_results import compare_reuse, heatmap_table, lines_table, read_sweep
from topl_core.analysis.studies.sweeps import SweepConfig, Window, plan_windows, run_sweep
from topl_core.bench.workbench import benchmark_prefix_reuse
from topl_core.models.architecture import embed_inputs, forward_from_hidden
from topl_core.models.loading import load_model
from topl_core.models.tiny import TINY_FAMILIES, build_tiny_tokenizer
from topl_core.training.prefix_cache import PrefixStore, install_prefix_cache

TEXTS = [
    "The council approved the new budget on Monday after a long debate. Police arrested two men in London "
    "and released a third without charge.",
    "She won the election.",
]


def _hidden_states(model, tok):
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
    return enc, out.hidden_states


def _check_all_ranges(model, tok):
    enc, hs = _hidden_states(model, tok)
    n = model.config.num_hidden_layers
    real = enc["attention_mask"].bool()  # padded positions are not compared (their values are arbitrary)
    assert enc["input_ids"].shape[1] > 16 and not real.all()  # longer than the sliding window, and padded
    torch.testing.assert_close(embed_inputs(model, enc["input_ids"]), hs[0], rtol=0, atol=0)
    norm = model.model.norm
    with torch.no_grad():
        for s in range(n):
            for e in range(s, n):
                h = forward_from_hidden(model, hs[s], enc["attention_mask"], s, e)
                # hidden_states[e + 1] is layer e's output; the last entry has the final norm applied
                want = hs[e + 1]
                got = norm(h) if e == n - 1 else h
                torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_forward_from_hidden_equals_full_forward(family):
    lm = load_model(family)
    _check_all_ranges(lm.model, lm.tokenizer)


def test_forward_from_hidden_gemma3_mixed_sliding_and_full_layers():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = build_tiny_tokenizer(chat=False)
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        pad_token_id=tok.pad_token_id,
    )
    model = Gemma3ForCausalLM(cfg).float().eval()
    _check_all_ranges(model, tok)
    # the sliding mask matters here: running a sliding layer with full attention gives something else
    enc, hs = _hidden_states(model, tok)
    full_cfg = Gemma3TextConfig(**{**cfg.to_dict(), "layer_types": ["full_attention"] * 4})
    wrong = Gemma3ForCausalLM(full_cfg).float().eval()
    wrong.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(forward_from_hidden(wrong, hs[0], enc["attention_mask"], 0, 0), hs[1], atol=1e-4)


def test_prefix_store_advances_and_reuses():
    lm = load_model("tiny-qwen3")
    enc, hs = _hidden_states(lm.model, lm.tokenizer)
    store = PrefixStore()
    real = enc["attention_mask"].bool()
    for start in (1, 1, 3, 2):
        h = store.entering(lm.model.model, enc["input_ids"], enc["attention_mask"], start)
        torch.testing.assert_close(h[real], hs[start][real], rtol=1e-5, atol=1e-5)
    st = store.stats
    # 1: computed from the embeddings (1 layer); 1 again: reused; 3: advanced 1→3 (2 layers); 2: lower, recomputed (2)
    assert (st.batches_computed, st.batches_reused, st.batches_advanced) == (2, 1, 1)
    assert st.layer_passes == 1 + 2 + 2 and len(store) == 1


def test_prefix_reuse_trains_exactly_what_the_plain_trainer_trains(tiny_records, tmp_path):
    from topl_core.training.config import LoraSettings
    from topl_core.training.trainer import train

    store = PrefixStore()
    for start in (1, 2):
        cfg = tiny_config(lora=LoraSettings(layer_start=start, layer_end=start + 1), steps=3, eval_every=3)
        plain = train(cfg, tmp_path / f"plain{start}", records=tiny_records, base=load_model("tiny-llama"))
        lm = install_prefix_cache(load_model("tiny-llama"), store, start)
        reused = train(cfg, tmp_path / f"reuse{start}", records=tiny_records, base=lm)
        a, b = load_file(plain.adapter_path), load_file(reused.adapter_path)
        assert sorted(a) == sorted(b) and all(f"layers.{start}." in k or f"layers.{start + 1}." in k for k in a)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            load_file(plain.head_path)["weight"], load_file(reused.head_path)["weight"], rtol=1e-5, atol=1e-6
        )
        assert plain.read_metrics()[-1]["val_token_auroc"] == pytest.approx(
            reused.read_metrics()[-1]["val_token_auroc"], abs=1e-6
        )
    assert store.stats.layer_passes_saved > 0
    # an adapter trained through the prefix cache loads and merges into the full model
    from topl_core.training.adapters import load_adapter

    merged = load_adapter(load_model("tiny-llama"), tmp_path / "reuse2", merge=True)
    assert len(merged.model.layers) == 4


def test_plan_windows_grid():
    ws = plan_windows(30, (3, 6, 12), 6)
    assert [(w.start, w.size) for w in ws if w.size == 12] == [(0, 12), (6, 12), (12, 12), (18, 12)]
    assert len(ws) == 5 + 5 + 4 and all(w.end < 30 for w in ws)
    assert ws == sorted(ws)  # by start first: the prefix store only moves up
    assert Window(6, 3).end == 8 and Window(6, 3).name == "s06-k03"
    with pytest.raises(ValueError, match="window size"):
        plan_windows(4, (5,), 1)


def _sweep_cfg(reuse=True, windows=((0, 1), (1, 2), (2, 1)), **train):
    return SweepConfig(
        train=tiny_config(steps=2, eval_every=2, checkpoint_every=1, **train), windows=windows, reuse_prefix=reuse
    )


def test_sweep_resumes_without_redoing_finished_windows(tiny_records, tmp_path, monkeypatch):
    calls: list[str] = []
    real_train = sweeps.train

    def counting_train(cfg, out_dir, **kw):
        calls.append(f"{cfg.lora.layer_start}-{cfg.lora.layer_end}")
        return real_train(cfg, out_dir, **kw)

    monkeypatch.setattr(sweeps, "train", counting_train)  # the trainer as the sweep calls it
    loader = lambda: load_model("tiny-llama")  # noqa: E731
    cfg = _sweep_cfg()

    def stop_in_third_window(ev):  # interrupt: cancel during the last window's first step
        return not (ev["event"] == "step" and ev["window"] == "s02-k01")

    df = run_sweep(cfg, tmp_path / "sw", stop_in_third_window, loader, tiny_records)
    assert list(df["window"]) == ["s00-k01", "s01-k02"] and calls == ["0-0", "1-2", "2-2"]
    assert json.loads((tmp_path / "sw" / "status.json").read_text())["state"] == "cancelled"
    assert (tmp_path / "sw" / "windows" / "s02-k01" / "checkpoint").exists()

    calls.clear()
    df = run_sweep(cfg, tmp_path / "sw", None, loader, tiny_records)
    assert calls == ["2-2"]  # only the unfinished window, resumed from its checkpoint
    assert sorted(df["window"]) == ["s00-k01", "s01-k02", "s02-k01"]
    assert json.loads((tmp_path / "sw" / "status.json").read_text())["state"] == "finished"

    calls.clear()
    run_sweep(cfg, tmp_path / "sw", None, loader, tiny_records)
    assert calls == []  # nothing left to do

    # rows lost (crash between training and writing the row): rebuilt from the complete run dirs, no retraining
    (tmp_path / "sw" / "results.jsonl").unlink()
    df2 = run_sweep(cfg, tmp_path / "sw", None, loader, tiny_records)
    assert calls == [] and sorted(df2["window"]) == sorted(df["window"])
    np.testing.assert_allclose(
        df2.sort_values("window")["val_token_auroc"], df.sort_values("window")["val_token_auroc"]
    )

    # a different training config in the same directory is refused
    with pytest.raises(ValueError, match="different"):
        run_sweep(
            SweepConfig(train=tiny_config(steps=3), windows=((0, 1),)), tmp_path / "sw", None, loader, tiny_records
        )


def test_sweep_with_and_without_reuse_agree_and_tables(tiny_records, tmp_path, mlflow_uri):
    loader = lambda: load_model("tiny-llama")  # noqa: E731
    windows = ((0, 2), (1, 1), (2, 2), (3, 1))
    # logged as they train: the windows of one sweep in one MLflow experiment, named after the sweep's folder
    tracked = _sweep_cfg(True, windows, report_to=("tensorboard", "mlflow"), mlflow_tracking_uri=mlflow_uri)
    a = run_sweep(tracked, tmp_path / "reuse-tracked", None, loader, tiny_records)
    b = run_sweep(_sweep_cfg(False, windows), tmp_path / "plain", None, loader, tiny_records)
    np.testing.assert_allclose(
        a.sort_values("window")["val_token_auroc"], b.sort_values("window")["val_token_auroc"], atol=1e-6
    )
    assert a["prefix_layer_passes_saved"].sum() > 0 and "prefix_layer_passes" not in b.columns
    cmp = compare_reuse(a, b)
    assert len(cmp) == 4 and {"train_s_reuse", "train_s_plain", "saving"} <= set(cmp.columns)
    hm = heatmap_table(a)
    assert list(hm.columns) == [1, 2] and list(hm.index) == [0, 1, 2, 3] and np.isnan(hm.loc[1, 2])
    assert hm.loc[2, 2] == pytest.approx(float(a.set_index("window").loc["s02-k02", "val_token_auroc"]))
    lines = lines_table(a, sizes=(1, 2))
    assert list(lines.columns) == ["size", "start", "val_token_auroc"] and len(lines) == 4
    assert read_sweep(tmp_path / "reuse-tracked").shape[0] == 4

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    client = MlflowClient(tracking_uri=mlflow_uri)
    logged = client.search_runs([client.get_experiment_by_name("reuse-tracked").experiment_id])
    assert sorted(r.info.run_name for r in logged) == sorted(a["window"])
    for r in logged:
        auroc = float(a.set_index("window").loc[r.info.run_name, "val_token_auroc"])
        assert r.data.metrics["val_token_auroc"] == pytest.approx(auroc)
        events = EventAccumulator(str(tmp_path / "reuse-tracked" / "windows" / r.info.run_name))
        events.Reload()
        assert events.Scalars("val_token_auroc")[-1].value == pytest.approx(auroc, rel=1e-6)


def test_sweep_cli_help_and_show(tmp_path, capsys):
    from topl_core.cli import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--background" in capsys.readouterr().out
    assert main(["sweep", "--show", str(tmp_path)]) == 0
    assert "no finished windows" in capsys.readouterr().out


# --- label sensitivity -------------------------------------------------------------------------------------


def test_label_study_rows_and_stats_follow_variants(tiny_records, tmp_path, mlflow_uri):
    from topl_core.analysis.studies.label_sensitivity import LabelStudyConfig, label_stats_for, run_label_study
    from topl_core.data.label_settings import LABEL_SETTINGS, label_settings_table
    from topl_core.data.split import split_records
    from topl_core.training.batching import EncodeSettings
    from topl_core.training.methods import METHODS

    tcfg = tiny_config(steps=2, eval_every=2)
    cfg = LabelStudyConfig(train=tcfg)
    lm = load_model("tiny-llama")
    # the labels the trainer starts from, computed independently, through data.variants' own table
    train_recs = split_records(tiny_records, seed=tcfg.split_seed)["train"]
    ex = METHODS["topl"].prepare(
        lm.tokenizer, train_recs, EncodeSettings(tcfg.max_doc_tokens, tcfg.max_response_tokens)
    )
    want = label_settings_table([e.response_labels for e in ex], tcfg.seed)
    stats = label_stats_for(cfg, tiny_records, lm.tokenizer)
    assert list(stats["setting"]) == list(LABEL_SETTINGS)
    for col in ("tokens", "good", "bad", "pct_good", "pct_bad", "examples"):
        np.testing.assert_allclose(stats[col].to_numpy(float), want[col].to_numpy(float))
    row = stats.set_index("setting")
    assert row.loc["balanced", "pct_bad"] == pytest.approx(50) and row.loc["good_only", "bad"] == 0
    assert row.loc["random", "tokens"] == row.loc["original", "tokens"]

    settings = ("original", "balanced", "good_only")
    tracked = tiny_config(steps=2, eval_every=2, report_to=("mlflow",), mlflow_tracking_uri=mlflow_uri)  # grouped
    df = run_label_study(
        LabelStudyConfig(train=tracked, settings=settings),
        tmp_path / "ls",
        records=tiny_records,
        base_loader=lambda: load_model("tiny-llama"),
    )
    assert list(df["setting"]) == list(settings) and (df["state"] == "finished").all()
    assert df["val_token_auroc"].notna().all()
    for s in settings:  # each run trained on its own setting, validated on the original labels
        from topl_core.training.run_dirs import RunDir

        run_cfg, _ = RunDir(tmp_path / "ls" / s).read_config()
        assert run_cfg.label_setting == s
    np.testing.assert_allclose(
        df.set_index("setting").loc[list(settings), "pct_bad"], row.loc[list(settings), "pct_bad"]
    )
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    logged = client.search_runs([client.get_experiment_by_name("ls").experiment_id])
    assert {r.info.run_name: r.data.params["label_setting"] for r in logged} == {s: s for s in settings}


def test_benchmark_interleaves_modes_and_agrees(tiny_records, tmp_path):
    cfg = SweepConfig(train=tiny_config(steps=2, eval_every=2))
    df = benchmark_prefix_reuse(
        cfg, tmp_path, windows=[(0, 1), (2, 1)], records=tiny_records, base_loader=lambda: load_model("tiny-llama")
    )
    assert list(df["mode"]) == ["reuse", "plain", "plain", "reuse"]
    piv = df.pivot(index="window", columns="mode", values="val_token_auroc")
    np.testing.assert_allclose(piv["reuse"], piv["plain"], atol=1e-6)
    assert (df["cpu_s"] > 0).all() and df.loc[df["mode"] == "reuse", "prefix_layer_passes"].sum() > 0


def test_executor_settings_are_checked_before_any_work(capsys):
    """Where a study's tasks run: bad resources and a Ray address without Ray are refused with the fix, by the
    config and by the CLI (exit 2, before loading anything); the λ study refuses Ray (it runs in its process)."""
    from topl_core.cli import build_parser, main
    from topl_core.cli.common import executor_from_args
    from topl_core.foundations.executor import ExecutorConfig

    for bad in (dict(kind="slurm"), dict(kind="ray", cpus_per_task=0), dict(kind="ray", max_retries=-1)):
        with pytest.raises(ValueError):
            ExecutorConfig(**bad)
    assert ExecutorConfig(kind="ray", address="").address is None  # an empty form field: start Ray here
    ray = ExecutorConfig(kind="ray", address="auto", cpus_per_task=2, gpus_per_task=0.5, max_retries=1)
    assert ExecutorConfig.from_json(ray.to_json()) == ray
    args = ["sweep", "--resume", "unused", *ray.cli_args()]  # how a background resume asks for it
    assert executor_from_args(build_parser(args).parse_args(args)) == ray
    assert main(["sweep", "--out", "unused", "--ray-address", "auto"]) == 2
    assert "needs --executor ray" in capsys.readouterr().err
    assert main(["evaluate", "--run", "unused", "--lambdas", "1", "--executor", "ray"]) == 2
    assert "λ study" in capsys.readouterr().err


def test_ray_is_optional_and_executor_ray_without_it_names_the_install_command(capsys, tmp_path, monkeypatch):
    """Ray is an optional extra (requirements-ray.txt, pyproject's `ray`; set-up installs it for these tests), not a
    requirement of the app or the CLI; `--executor ray` where it is missing is refused before anything is written,
    by the CLI and by run_tasks, naming the command that installs it."""
    import sys
    import tomllib
    from pathlib import Path

    from topl_core.cli import main
    from topl_core.foundations.errors import ConfigError
    from topl_core.foundations.executor import ExecutorConfig, run_tasks

    repo = Path(__file__).resolve().parents[1]
    required = (repo / "requirements.txt").read_text().splitlines()
    assert not [line for line in required if line.split("=")[0].split("[")[0].strip() == "ray"]
    assert "ray==" in (repo / "requirements-ray.txt").read_text()
    assert "ray" in tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "requirements-ray.txt" in (repo / "scripts" / "setup.sh").read_text()

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: find_spec and import both fail
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), "--model", "tiny-llama", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install -r requirements-ray.txt" in err and "--executor local" in err and not out.exists()
    with pytest.raises(ConfigError, match="pip install -r requirements-ray.txt"):
        run_tasks(lambda shared, item: {}, None, [1], ExecutorConfig(kind="ray"), lambda item, row: None)


def test_an_unreachable_ray_cluster_is_refused_in_seconds(capsys, tmp_path):
    """A cluster address where nothing listens: refused by the probe before anything is loaded or written, naming
    the flag and the fix (Ray's own connect retried for minutes); a study run directly is refused by run_tasks."""
    from topl_core.cli import main
    from topl_core.foundations.errors import ServiceError
    from topl_core.foundations.executor import ExecutorConfig, run_tasks

    address = f"127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    assert main(["sweep", "--out", str(tmp_path / "sweep"), "--executor", "ray", "--ray-address", address]) == 2
    err = capsys.readouterr().err
    assert f"--ray-address = {address}: the Ray cluster's head node" in err and "not reachable" in err
    assert "ray start --head" in err and not (tmp_path / "sweep").exists()
    with pytest.raises(ServiceError, match="not reachable"):
        run_tasks(lambda shared, item: {}, None, [1], ExecutorConfig(kind="ray", address=address), lambda i, r: None)
    assert time.perf_counter() - t0 < 10
