"""scripts/gpu_sitting.py, the prepared GPU sitting: every command of every part, on the GPU and in the CPU dry
run, parses with the parser of the command or script it calls (a typo there would cost a device call), and the
steering session a GPU run's benches open loads the model on the device the run was trained on."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from topl_core.cli import build_parser
from topl_core.hardware import precision as precision_module
from topl_core.runtime import session as session_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_sitting as plan  # noqa: E402


class Parsed(Exception):
    """Raised by the patched parse_args once a script's arguments parsed, before the script does any work."""


def _parsed_only(self, args=None, namespace=None):
    raise Parsed(argparse.ArgumentParser.parse_known_args(self, args, namespace))


def _all_steps():
    for mode in (plan.GPU, plan.DRY):
        for part in plan.PARTS:
            for step in plan.steps_of(part, mode, plan.Paths(part, "h100")):
                yield mode.device, part, step


def test_every_command_of_every_part_parses(monkeypatch):
    scripts = 0
    for device, part, step in _all_steps():
        where = f"{device} {part} {step.name}"
        if step.args[0] == "-c":
            compile(step.args[1], where, "exec")
        elif step.args[:2] == ["-m", "topl_core"]:
            argv = step.args[2:]
            args = build_parser(argv).parse_args(argv)  # exits on an unknown or malformed argument
            assert "--device" not in argv or args.device == device, where
        else:
            script = REPO / step.args[0]
            assert script.is_file(), where
            monkeypatch.setattr(sys, "argv", [str(script), *step.args[1:]])
            monkeypatch.setattr(argparse.ArgumentParser, "parse_args", _parsed_only)
            with pytest.raises(Parsed) as parsed:
                runpy.run_path(str(script), run_name="__main__")
            monkeypatch.undo()
            assert parsed.value.args[0][1] == [], f"{where}: unknown arguments {parsed.value.args[0][1]}"
            scripts += 1
    assert scripts == 2 * 3  # the profile, the kill-and-resume and the pages, on both devices


def test_each_part_ends_within_a_device_call_and_names_the_gpu():
    for device, part, step in _all_steps():
        assert step.timeout_s <= plan.BUDGET_S, (device, part, step.name)
        assert step.json is None or "-h100-" in step.json, (device, part, step.name)  # the GPU's name, for docs/bench
    assert plan.BUDGET_S + 60 < 600  # the budget, the wheels and the packing inside one call's 10 minutes


def test_a_session_loads_the_model_on_the_device_its_run_was_trained_on(monkeypatch):
    """A bare model name loaded on the CPU: on a GPU machine, bench --slider / --gated / --serve decoded there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision_module, "cuda_bf16", lambda: True)
    loaded = []

    def load_merged(spec, adapter):
        loaded.append(spec)
        raise Parsed

    monkeypatch.setattr(session_module, "load_merged", load_merged)
    monkeypatch.setattr(session_module, "open_adapter", lambda a: a)
    vectors = SimpleNamespace(adapter_fingerprint=None)
    for device, weights in (("cuda", "bf16"), ("cpu", "fp32")):
        adapter = SimpleNamespace(base_model="qwen3-8b@random", device=device)
        for spec in (None, "qwen3-8b@random"):
            with pytest.raises(Parsed):
                session_module.SteeringSession.from_run(adapter, vectors, spec)
            assert (loaded[-1].name, loaded[-1].device, loaded[-1].dtype) == ("qwen3-8b@random", device, weights)
