"""Experiment trackers (report_to), the model card of every finished run, and `export`: read back with the
trackers' own readers, the train CLI's own parser and PEFT's own loader."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time

import pytest
from conftest import REPO, free_port, tiny_config

from topl_core.cli import build_parser, main
from topl_core.cli.train import config_from_args
from topl_core.data.records import write_jsonl
from topl_core.foundations.errors import ConfigError, RunError, ServiceError
from topl_core.jobs.background import read_job
from topl_core.models.loading import layer_count
from topl_core.training.adapters import open_adapter
from topl_core.training.config import TrainConfig
from topl_core.training.run_dirs import RunDir
from topl_core.training.sharing import export_run
from topl_core.training.tracking import INSTALL, RUN_DIR_TAG, check_trackers, numeric_metrics
from topl_core.training.trainer import train

DEMOS = ("topl-smollm2", "sft-smollm2")


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, tiny_records, mlflow_uri):
    """A finished tiny TOPL run with a side probe, logged to TensorBoard and to an MLflow SQLite store; cancelled
    after step 3 and resumed, so each tracker must carry on where it stopped (a second event file, the same MLflow
    run)."""
    root = tmp_path_factory.mktemp("tracked")
    cfg = tiny_config(steps=5, probe_layers=(1,), report_to=("tensorboard", "mlflow"), mlflow_tracking_uri=mlflow_uri)
    kw = dict(records=tiny_records, tracking_group="tiny-study")
    stopped = train(cfg, root / "topl-tiny", progress=lambda p: p.step < 3, **kw)
    assert stopped.read_status()["state"] == "cancelled"
    return train(cfg, root / "topl-tiny", **kw), mlflow_uri


def _logged(run: RunDir) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as {metric: [(step, value)]}, the numbers a tracker gets."""
    out: dict[str, list] = {}
    for row in run.read_metrics():
        for name, value in numeric_metrics(row).items():
            out.setdefault(name, []).append((row["step"], value))
    return out


def test_tensorboard_event_file_holds_the_metrics_jsonl_rows(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = tracked
    logged = _logged(run)
    assert {"loss", "lr", "tokens_per_s", "val_token_auroc", "val_token_auroc_L1"} <= set(logged)
    assert len(list(run.path.glob("events.out.tfevents.*"))) == 2  # before the stop, after the resume
    events = EventAccumulator(str(run.path), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(logged)
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    start_info = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = HParamsPluginData.FromString(start_info).session_start_info.hparams  # the config, on the HParams tab
    cfg, _ = run.read_config()
    assert hparams["lora_r"].number_value == cfg.lora.r and hparams["report_to"].string_value == "tensorboard mlflow"
    for name, series in logged.items():
        read = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in read] == [s for s, _ in series], name
        assert [v for _, v in read] == pytest.approx([v for _, v in series], rel=1e-6), name  # float32 in the file


def test_mlflow_store_holds_the_metrics_and_the_config(tracked):
    from mlflow.tracking import MlflowClient

    run, uri = tracked
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny-study")
    (logged_run,) = client.search_runs([experiment.experiment_id])
    assert logged_run.info.run_name == run.name and logged_run.info.status == "FINISHED"
    cfg, _ = run.read_config()
    params = logged_run.data.params
    assert params["lora_r"] == str(cfg.lora.r) and params["probe_layers"] == "1" and params["method"] == "topl"
    for name, series in _logged(run).items():
        history = client.get_metric_history(logged_run.info.run_id, name)
        assert sorted((m.step, m.value) for m in history) == pytest.approx(series), name


def _card_command(run: RunDir) -> list[str]:
    block = re.search(r"```bash\n(.+?)\n```", run.card_path.read_text(), re.S).group(1)
    return shlex.split(block)


@pytest.mark.parametrize("fixture", ["tracked", "tiny_run"])
def test_card_command_parsed_by_the_train_cli_gives_the_runs_config(fixture, request):
    run = request.getfixturevalue(fixture)
    run = run[0] if isinstance(run, tuple) else run
    argv = _card_command(run)
    assert argv[:4] == ["python", "-m", "topl_core", "train"]
    args = build_parser(argv[3:]).parse_args(argv[3:])
    cfg, meta = run.read_config()
    assert config_from_args(args) == cfg and args.out == str(run.path)
    text = run.card_path.read_text()
    last_val = [r for r in run.read_metrics() if "val_token_auroc" in r][-1]
    assert f"{last_val['val_token_auroc']:.4g}" in text and meta["data_fingerprint"] in text
    assert "PeftModel.from_pretrained" in text and f"layers {cfg.lora.layer_start}–{cfg.lora.layer_end}" in text


@pytest.mark.parametrize("name", DEMOS)
def test_demo_adapter_cards_and_fingerprints(name):
    """The shipped demos carry cards from the same code, and their identity is what the shipped analysis cache was
    computed for (the card is not part of an adapter's fingerprint)."""
    run = RunDir(REPO / "examples" / "adapters" / name)
    argv = _card_command(run)
    recorded = run.read_config()[0]
    given = config_from_args(build_parser(argv[3:]).parse_args(argv[3:]))  # a layer range left to the model's depth
    assert given.for_depth(layer_count(recorded.model)) == recorded
    shipped = {
        json.loads(p.read_text()).get("adapter_fingerprint")
        for p in (REPO / "examples" / "analysis-cache").rglob("*.json")
        if not p.name.endswith(".key.json")
    }
    assert open_adapter(run.path).fingerprint() in shipped


def test_export_opens_with_plain_peft_and_holds_no_checkpoint(tiny_run, tmp_path, capsys):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from topl_core.models.tiny import build_tiny_model

    dest = tmp_path / "shared"
    assert main(["export", str(tiny_run.path), str(dest)]) == 0
    names = {p.name for p in dest.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "head.safetensors", "README.md"} <= names
    assert {"topl_config.json", "metrics.jsonl"} <= names and not names & {"checkpoint", "LOCK", "STOP"}
    model = PeftModel.from_pretrained(build_tiny_model("tiny-llama")[0], dest)
    theirs = load_file(tiny_run.adapter_path)
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(theirs) > 0
    for key, value in theirs.items():
        assert torch.equal(loaded[key.replace(".weight", ".default.weight")], value)
    assert open_adapter(dest).fingerprint() == tiny_run.fingerprint()
    with pytest.raises(RunError, match="not empty"):
        export_run(tiny_run, dest)


def test_push_to_hub_offline_fails_at_once_with_the_upload_command(tiny_run, tmp_path, capsys):
    t0 = time.perf_counter()
    assert main(["export", str(tiny_run.path), str(tmp_path / "x"), "--push-to-hub", "someone/topl-tiny"]) == 2
    err = capsys.readouterr().err
    assert "not reachable" in err and "hf upload someone/topl-tiny" in err
    assert (tmp_path / "x" / "adapter_model.safetensors").exists()  # the export itself is done
    assert time.perf_counter() - t0 < 30  # HF_HUB_OFFLINE (conftest): no network wait


HOSTILE_FOLDER = "my models: v2 #3 | final"  # YAML reads ": " as a mapping and " #" as a comment; "|" ends a cell


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory, tiny_records):
    """A tiny run whose base model is a local folder named with ": ", "#" and "|"."""
    from topl_core.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("hostile")
    base = root / HOSTILE_FOLDER / "tiny"
    model, tokenizer = build_tiny_model("tiny-llama")
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    return train(tiny_config(model=str(base), steps=2), root / "run", records=tiny_records), base


def test_a_hostile_base_model_path_gives_a_card_whose_metadata_reads_back(hostile_run):
    """The card's header is written by huggingface_hub's ModelCardData: it parses back to exactly the metadata meant
    (a local base path is named in the text, not as the hub's base_model, which must be a hub id), the path stays
    whole in the text and the Python it shows, and the card passes the check made before any push."""
    import yaml
    from huggingface_hub import ModelCard

    run, base = hostile_run
    text = run.card_path.read_text()
    header = yaml.safe_load(text.split("---\n")[1])
    assert header == {"library_name": "peft", "tags": ["lora", "topl-workbench", "topl"]}
    assert ModelCard.load(run.card_path).data.to_dict() == header
    assert f"from_pretrained({json.dumps(str(base))})" in text
    assert str(base).replace("|", "\\|") in text  # in the table, its "|" escaped
    from topl_core.training.card import check_card

    check_card(run.card_path)


def test_push_to_hub_refuses_a_card_the_hub_would_misread_before_sending_anything(hostile_run, tmp_path, monkeypatch):
    """A card whose header is an f-string of the hostile path (as cards were written before) is refused before any
    request, even with the hub reachable; `export` writes a new card in its place; a valid card is validated by the
    hub before the repository is made and the folder uploaded."""
    import huggingface_hub
    from huggingface_hub import ModelCard

    from topl_core.training import sharing
    from topl_core.training.card import write_card

    run, base = hostile_run
    calls = []

    class Hub:
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id))

        def upload_folder(self, repo_id, folder_path):
            calls.append(("upload_folder", repo_id))
            return f"https://hub/{repo_id}"

    monkeypatch.setattr(sharing, "hub_reachable", lambda: True)
    monkeypatch.setattr(huggingface_hub, "HfApi", Hub)
    monkeypatch.setattr(ModelCard, "validate", lambda card, repo_type=None: calls.append(("validate", card.data)))
    old = f"---\nbase_model: {base}\nlibrary_name: peft\ntags:\n- lora\n- topl-workbench\n- topl\n---\n\n# old card\n"
    export_run(run, tmp_path / "fresh")
    (tmp_path / "fresh" / "README.md").write_text(old)
    with pytest.raises(RunError, match="metadata does not parse"):
        sharing.push_to_hub(tmp_path / "fresh", "someone/hostile")
    assert calls == []  # nothing reached the hub

    run.card_path.write_text(old)  # the run's own card as it was written before
    try:
        with pytest.warns(RuntimeWarning, match="does not parse.*Wrote a new one in the export"):
            export = export_run(run, tmp_path / "again")
    finally:
        write_card(run)
    assert "# old card" not in export.card_path.read_text()
    assert sharing.push_to_hub(export.path, "someone/hostile") == "https://hub/someone/hostile"
    assert [c[0] for c in calls] == ["validate", "create_repo", "upload_folder"]


def test_missing_tracker_package_fails_before_training(monkeypatch, tmp_path, tiny_records):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: find_spec and import both fail
    with pytest.raises(ConfigError, match=re.escape(INSTALL)) as e:
        train(tiny_config(report_to=("tensorboard",)), tmp_path / "run", records=tiny_records)
    assert "tensorboard" in str(e.value) and not (tmp_path / "run").exists()


def test_report_to_names_a_known_tracker():
    with pytest.raises(ConfigError, match=r"report_to=\('wandb',\).*tensorboard"):
        TrainConfig(report_to=("wandb",))
    with pytest.raises(ConfigError, match="mlflow_tracking_uri"):
        TrainConfig(mlflow_tracking_uri="sqlite:///x.db")


def test_an_unreachable_mlflow_server_is_refused_in_seconds_before_training(tmp_path, tiny_records):
    """A tracking URI where nothing listens (a typo'd port), through the real CLI: one `error:` line naming the URI,
    the flag and the fixes, exit 2, no traceback, no run folder — where MLflow's own retries took four minutes."""
    data = write_jsonl(tiny_records, tmp_path / "d.jsonl")
    uri = f"http://127.0.0.1:{free_port()}"
    argv = ["train", "--model", "tiny-llama", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "2",
            "--lora-layer-end", "2", "--report-to", "mlflow", "--mlflow-tracking-uri", uri]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "topl_core", *argv], capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{uri}: MLflow's tracking store at 127.0.0.1:" in error and "not reachable" in error
    assert "--mlflow-tracking-uri" in error and "mlflow server" in error and "--report-to" in error
    assert not (tmp_path / "run").exists()
    # the interpreter and the core's imports (docs/reliability.md, "Figures behind the tests' choices"), not a
    # network wait
    assert took < 90, took
    t0 = time.perf_counter()
    with pytest.raises(ServiceError, match="not reachable"):  # the probe itself, as the Train page calls it
        check_trackers(tiny_config(report_to=("mlflow",), mlflow_tracking_uri=uri))
    assert time.perf_counter() - t0 < 5


def test_a_tracker_failing_mid_run_leaves_a_finished_run_and_a_warning(tmp_path, tiny_records, mlflow_uri):
    """The run's MLflow run is deleted by someone else after step 2 (a real store, a real failure): MLflow refuses
    the next rows, training goes on to a finished run, the failure is warned, recorded in status.json (the Runs page
    reads it through read_job) and not repeated; metrics.jsonl keeps every step."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    cfg = tiny_config(steps=4, report_to=("mlflow",), mlflow_tracking_uri=mlflow_uri)
    run_path = tmp_path / "topl-tiny"
    client = MlflowClient(tracking_uri=mlflow_uri)

    def delete_the_mlflow_run(p) -> None:
        if p.step == 2:
            experiment = client.get_experiment_by_name("mid-run-failure")
            (logged,) = client.search_runs([experiment.experiment_id], f"tags.`{RUN_DIR_TAG}` = '{run_path.resolve()}'")
            client.delete_run(logged.info.run_id)

    with pytest.warns(RuntimeWarning, match="the mlflow tracker failed at step 3") as seen:
        run = train(
            cfg, run_path, progress=delete_the_mlflow_run, records=tiny_records, tracking_group="mid-run-failure"
        )
    assert run.read_status()["state"] == "finished" and run.is_complete
    assert [r["step"] for r in run.read_metrics() if "loss" in r] == [1, 2, 3, 4]
    (warning,) = read_job(run.path).warnings  # once: the broken tracker got no later rows
    assert warning.startswith("the mlflow tracker failed at step 3 (") and "metrics.jsonl has every row" in warning
    assert sum("mlflow tracker" in str(w.message) for w in seen) == 1
    experiment = client.get_experiment_by_name("mid-run-failure").experiment_id
    deleted = client.search_runs([experiment], run_view_type=ViewType.DELETED_ONLY)
    assert [m.step for m in client.get_metric_history(deleted[0].info.run_id, "loss")] == [1, 2]
