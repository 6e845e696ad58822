"""The method registry (topl_core/training/methods/): every method module is registered under its own name, with the
paper's hyperparameters for every preset, and validates in TrainConfig. A method defined here — one `Method`, as a
new module of that package would hold, put in METHODS with monkeypatch — reaches TrainConfig's validation, the
presets' lookup, `train --method` (and trains through it) and the Train page's choices, with nothing else edited."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
import torch

from topl_core.cli import build_parser, main
from topl_core.cli.train import config_from_args
from topl_core.data.encode import IGNORE, Batch
from topl_core.data.records import write_jsonl
from topl_core.foundations.errors import ConfigError
from topl_core.foundations.presets import PRESETS, MethodHyper
from topl_core.training import methods as methods_package
from topl_core.training.batching import encode_token_labelled
from topl_core.training.config import TrainConfig, preset_config
from topl_core.training.methods import METHODS, Method
from topl_core.training.run_dirs import RunDir
from topl_core.training.steps import StepContext, head_logits, validate_head

APP = str(Path(__file__).resolve().parents[1] / "app.py")

# --- a method that is in no module of topl_core: the token-level Brier score of the head ---------------------------


def brier_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of p(good) = σ(logit) against the token labels, unlabelled tokens (-1) left out."""
    mask = labels != IGNORE
    error = (torch.sigmoid(logits.float()) - labels.clamp(min=0).float()) ** 2
    return (error * mask).sum() / mask.sum().clamp(min=1)


def brier_loss_step(ctx: StepContext, batch: Batch) -> tuple[torch.Tensor, dict]:
    return brier_loss(head_logits(ctx, batch), batch.labels), {"supervised_tokens": batch.n_labelled}


BRIER = Method(
    name="brier",
    label="Brier",
    description="Token-level Brier score of a linear head on FinalNorm(layer m).",
    requires="token_labels",
    loss=brier_loss_step,
    prepare=encode_token_labelled,
    validate=validate_head,
    paper={  # numbers no other method has, so a lookup that reached another method would show
        "qwen3-8b": MethodHyper(3e-5, 12, 2),
        "llama3.1-8b": MethodHyper(7e-5, 12, 2),
        "gemma3-4b": MethodHyper(9e-5, 12, 2),
    },
    head_position="lora_end",
    lora_all_layers=True,
    validation_metric="val_token_auroc",
)


@pytest.fixture
def brier(monkeypatch) -> Method:
    monkeypatch.setitem(METHODS, BRIER.name, BRIER)
    return BRIER


# --- the registry --------------------------------------------------------------------------------------------------


def test_every_method_module_is_registered_under_its_name():
    """Each module of training/methods/ (but base.py, what a method is) holds one METHOD named as the module, and
    the registry holds exactly those: a module left out of methods/__init__.py fails here."""
    names = sorted(m.name for m in pkgutil.iter_modules(methods_package.__path__) if m.name != "base")
    for name in names:
        method = importlib.import_module(f"{methods_package.__name__}.{name}").METHOD
        assert method.name == name and METHODS[name] is method, name
    assert sorted(METHODS) == names


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_has_the_papers_hyperparameters_and_validates(name):
    method = METHODS[name]
    assert set(method.paper) == set(PRESETS), "the paper's hyperparameters for every model-family preset"
    assert TrainConfig(method=name, model="tiny-llama").method == name
    assert method.head_layer(2, 4) == {"lora_end": 2, "last": 3, "none": None}[method.head_position]
    if method.probed:  # side probes read a token head's labels
        assert method.uses_head and method.requires == "token_labels"
    if method.pairs:
        assert method.requires == "pairs"


def test_unknown_methods_and_presets_are_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"method=.nope.: choose one of .*topl"):
        TrainConfig(method="nope")
    with pytest.raises(ConfigError, match="method='nope'"):
        preset_config("qwen3-8b", "nope")
    with pytest.raises(ConfigError, match="preset='mistral'"):
        METHODS["topl"].hyper("mistral")


# --- a new method reaches everything that reads the registry -------------------------------------------------------


def test_a_new_method_reaches_the_config_and_the_presets(brier):
    cfg = TrainConfig(method="brier", label_setting="random")  # a token-label method: label settings apply
    assert cfg.method == "brier"
    with pytest.raises(ConfigError, match="packing"):  # not packable
        TrainConfig(method="brier", packing=True)
    with pytest.raises(ConfigError, match="probe_layers"):  # not probed
        TrainConfig(method="brier", probe_layers=(0,))
    c = preset_config("llama3.1-8b", "brier")
    assert (c.lr, c.batch_size, c.grad_accum, c.head_lr_multiplier) == (7e-5, 12, 2, 1.0)
    assert (c.lora.layer_start, c.lora.layer_end) == (0, PRESETS["llama3.1-8b"].num_layers - 1)


def test_a_new_method_is_a_train_choice_and_trains_from_the_cli(brier, tmp_path, tiny_records, capsys):
    args = build_parser(["train"]).parse_args(["train", "--method", "brier", "--preset", "gemma3-4b"])
    assert (config_from_args(args).method, config_from_args(args).lr) == ("brier", 9e-5)

    data = tmp_path / "data.jsonl"
    write_jsonl(tiny_records, data)
    argv = ["train", "--method", "brier", "--model", "tiny-llama", "--data", str(data), "--out", str(tmp_path / "run")]
    argv += ["--steps", "2", "--eval-every", "2", "--lr", "0.01", "--lora-layer-end", "3", "--max-doc-tokens", "64"]
    assert main(argv) == 0, capsys.readouterr().err
    run = RunDir(tmp_path / "run")
    cfg, meta = run.read_config()
    assert cfg.method == "brier" and meta["objective"] == BRIER.description and meta["head_layer"] == 3
    assert meta["lora_all_layers"] and run.head_path.exists()
    last = run.read_metrics()[-1]
    assert last["step"] == 2 and 0 <= last["loss"] <= 1 and "val_token_auroc" in last  # a Brier score, validated


def test_a_new_method_reaches_the_train_form(brier, monkeypatch):
    """The Train page lists the registry's methods by label, describes the picked one, puts LoRA on every layer
    when the method is defined so, and takes a preset's numbers from the method's own table."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TOPL_DEFAULT_MODEL", "tiny-llama")
    monkeypatch.setenv("TOPL_EXAMPLES_DIR", "")
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("pages/train.py").run()
    assert not at.exception, [e.value for e in at.exception]
    method = at.selectbox(key="train.method")
    assert "Brier" in method.options and "TOPL" in method.options and "unlikelihood" in method.options
    method.set_value("brier").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(BRIER.description in box.value for box in at.info)
    assert (at.number_input(key="train.layer_start").value, at.number_input(key="train.layer_end").value) == (0, 3)
    at.selectbox(key="train.preset").set_value("qwen3-8b").run()
    assert not at.exception, [e.value for e in at.exception]
    lr, batch = at.number_input(key="train.lr").value, at.number_input(key="train.batch_size").value
    assert (lr, batch, at.number_input(key="train.grad_accum").value) == (3e-5, 12, 2)
