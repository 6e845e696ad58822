"""One description per setting (topl_core/foundations/config_fields.py): every field of the configs the CLI and the
forms show is described (label, help), a command's flags parse by the field's type, a config spelled as flags comes
back equal, and the forms' widgets follow the same description."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Literal

import pytest

from pages._ui.forms import config_inputs, field_input
from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.translation import TranslationConfig
from topl_core.analysis.lora_a.probe import ProbeSettings
from topl_core.analysis.lora_a.probe_head import ProbeHeadSettings
from topl_core.analysis.studies.data_sources import SOURCES
from topl_core.analysis.studies.deck import DeckConfig
from topl_core.analysis.studies.label_sensitivity import LabelStudyConfig
from topl_core.analysis.studies.reproduce_config import ReproduceConfig
from topl_core.analysis.studies.sweeps import SweepConfig
from topl_core.analysis.studies.transfer import TransferSettings
from topl_core.bench.scale import ScaleSettings
from topl_core.cli import build_parser, main
from topl_core.data import sources
from topl_core.data.records import Record, read_jsonl
from topl_core.foundations.config_fields import (
    DECLARED,
    add_config_args,
    config_args,
    config_argv,
    config_field,
    field_infos,
)
from topl_core.foundations.executor import ExecutorConfig
from topl_core.inference.generate import GenerationConfig
from topl_core.runtime.modes import SteerConfig
from topl_core.training.config import LoraSettings, TrainConfig

# the configs whose fields are command-line flags and form inputs
EXPOSED = (TrainConfig, LoraSettings, sources.SourceOptions, SweepConfig, LabelStudyConfig, ExecutorConfig, EvalConfig)
EXPOSED += (TranslationConfig, ReproduceConfig, TransferSettings, ProbeSettings, ProbeHeadSettings, GenerationConfig)
EXPOSED += (ScaleSettings, DeckConfig, SteerConfig)
EXPOSED += tuple(dict.fromkeys(s.options_type for s in SOURCES.values() if s.options_type not in EXPOSED))


@pytest.mark.parametrize("cls", EXPOSED, ids=lambda c: c.__name__)
def test_every_field_of_an_exposed_config_has_a_label_and_a_help(cls):
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field_infos(cls)[f.name].type):
            continue  # a nested config (TrainConfig.lora, SweepConfig.train) is shown through its own fields
        assert f.metadata.get("label") and f.metadata.get("help"), f"{cls.__name__}.{f.name}"


@dataclasses.dataclass(frozen=True)
class Inner:
    depth: int = config_field(2, label="Depth", help="how deep")


@dataclasses.dataclass(frozen=True)
class Knobs:
    rate: float = config_field(0.5, label="Rate", help="a rate", min=0.0, max=1.0)
    count: int = config_field(3, label="Count", help="a count", min=1)
    on: bool = config_field(False, label="On", help="a switch")
    mode: Literal["plain", "fancy"] = config_field("plain", label="Mode", help="a Literal")
    name: str = config_field("x", label="Name", help="described choices", choices=("x", "y"))
    path: str | None = config_field(None, label="Path", help="optional", flag="--where")
    layers: tuple[int, ...] = config_field((), label="Layers", help="a tuple")
    inner: Inner = dataclasses.field(default_factory=Inner)


def test_a_config_spelled_as_flags_parses_back_equal_with_every_type():
    parser = argparse.ArgumentParser()
    add_config_args(parser, Knobs, Knobs())
    changed = Knobs(0.25, 7, True, "fancy", "y", "p.txt", (1, 3), Inner(5))
    argv = config_argv(changed)
    assert argv[:2] == ["--rate", "0.25"] and "--where" in argv and "--inner-depth" in argv
    args = parser.parse_args(argv)
    assert (type(args.rate), type(args.count), type(args.on), args.layers) == (float, int, bool, [1, 3])
    values = config_args(args, Knobs)
    assert Knobs(**{k: v for k, v in values.items() if k != "inner_depth"}, inner=Inner(values["inner_depth"])) == (
        changed
    )
    assert config_args(parser.parse_args([]), Knobs) == {  # the defaults; the optional path (None) left out
        "rate": 0.5,
        "count": 3,
        "on": False,
        "mode": "plain",
        "name": "x",
        "layers": (),
        "inner_depth": 2,
    }
    assert config_argv(Knobs()) == [] and config_argv(Knobs(), always=("mode",)) == ["--mode", "plain"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--name", "z"])  # described choices are the flag's choices


def test_without_defaults_only_the_given_flags_come_back():
    """As `train` reads its flags: a flag not given keeps the config's (or a preset's) value."""
    parser = argparse.ArgumentParser()
    add_config_args(parser, Knobs)
    assert config_args(parser.parse_args(["--no-on", "--inner-depth", "4"]), Knobs) == {"on": False, "inner_depth": 4}
    assert "(default 0.5)" in parser.format_help()


@dataclasses.dataclass(frozen=True)
class WithRequired:
    name: str = config_field(label="Name", help="required: no default")
    size: int = config_field(4, label="Size", help="a declared default", min=1)


def test_a_config_with_required_fields_gives_its_declared_defaults():
    """DeckConfig's case: no instance to default the flags to, so DECLARED gives each field's declared default; a
    required field has none and is refused (its flag is written by hand)."""
    parser = argparse.ArgumentParser()
    add_config_args(parser, WithRequired, DECLARED, only=("size",))
    assert parser.parse_args([]).size == 4 and parser.parse_args(["--size", "9"]).size == 9
    with pytest.raises(TypeError, match="WithRequired.name has no declared default"):
        add_config_args(argparse.ArgumentParser(), WithRequired, DECLARED)


@dataclasses.dataclass(frozen=True)
class OptionsWithKnobs(sources.SourceOptions):
    ratio: float = config_field(0.5, label="Ratio", help="a float option")
    keep_case: bool = config_field(False, label="Keep case", help="a bool option")


def test_a_float_and_a_bool_option_of_a_data_source_parse_to_float_and_bool(monkeypatch, tmp_path):
    """`data build` once parsed every option but an int as text: a float or bool option was silently a str."""
    seen = []

    def load(options, progress) -> sources.Loaded:
        seen.append(options)
        return sources.Loaded([Record(id="r0", document="A cat.", response="A cat.", source="knobs")])

    knobs = ("ratio", "keep_case")
    help = "A source with a float and a bool option."
    entry = sources.DataSource("knobs", help, knobs, load, input_required=False, options_type=OptionsWithKnobs)
    monkeypatch.setitem(SOURCES, "knobs", entry)
    argv = ["data", "build", "--source", "knobs", "--ratio", "0.25", "--keep-case", "--out", str(tmp_path / "k.jsonl")]
    args = build_parser(argv).parse_args(argv)
    assert (args.ratio, args.keep_case) == (0.25, True) and (type(args.ratio), type(args.keep_case)) == (float, bool)
    assert main(argv) == 0 and len(read_jsonl(tmp_path / "k.jsonl")) == 1
    (options,) = seen
    assert (options.ratio, options.keep_case) == (0.25, True)
    assert (type(options.ratio), type(options.keep_case)) == (float, bool)


class Container:
    """Stands in for a Streamlit container: records each widget asked for and returns its starting value."""

    def __init__(self) -> None:
        self.widgets: dict[str, tuple[str, str, dict]] = {}

    def __getattr__(self, kind: str):
        def widget(label, *args, **kw):
            self.widgets[kw["key"]] = (kind, label, {**kw, "options": args[0] if args else None})
            if kind == "selectbox":
                return args[0][kw["index"]]
            return kw["default"] if kind == "multiselect" else kw["value"]

        return widget


def test_the_forms_build_each_widget_from_the_fields_description():
    box = Container()
    values = config_inputs(Knobs, [box], "k.", Knobs())
    kinds = {key: kind for key, (kind, _, _) in box.widgets.items()}
    assert kinds == {
        "k.rate": "number_input",
        "k.count": "number_input",
        "k.on": "toggle",
        "k.mode": "selectbox",
        "k.name": "selectbox",
        "k.path": "text_input",
        "k.layers": "multiselect",
        "k.depth": "number_input",
    }
    kind, label, kw = box.widgets["k.rate"]
    assert (label, kw["help"], kw["min_value"], kw["max_value"]) == ("Rate", "a rate", 0.0, 1.0)
    assert box.widgets["k.mode"][2]["options"] == ["plain", "fancy"] and box.widgets["k.name"][2]["options"] == [
        "x",
        "y",
    ]
    assert values["inner"] == Inner(2) and values["rate"] == 0.5
    # a page may word a field otherwise (the Layer sweep's "Steps per window") or bound it by the model's layers
    field_input(box, TrainConfig, "steps", "t.", 20, label="Steps per window", max_value=30)
    _, label, kw = box.widgets["t.steps"]
    assert (label, kw["min_value"], kw["max_value"]) == ("Steps per window", 1, 30)
