"""Each generation phase in its faster precision: the prompt (and training, scoring) in what `auto` picks
from the matmul probe, the one-token decode steps in what a decode-shaped probe picks; an explicit precision serves
both phases; the phases really run in what they say, and the streamed and batched paths still agree token for token."""

from __future__ import annotations

import json

import pytest
import torch

from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.hardware import precision as prec
from topl_core.hardware.machine import machine_key
from topl_core.inference.generate import GenerationConfig, generate, stream_generate
from topl_core.models.loading import load_model

# bf16 fast for a prompt-sized matmul but slow for one row through a float32 weight (autocast's cast per call)
AMX_SLOW_DECODE = prec.Bf16Probe(
    capability="AMX", amx=True, avx512_bf16=True, fp32_s=7e-4, bf16_s=1e-4, decode_fp32_s=4e-4, decode_bf16_s=1e-3
)
AMX_FAST_DECODE = prec.Bf16Probe(
    capability="AMX", amx=True, avx512_bf16=True, fp32_s=7e-4, bf16_s=1e-4, decode_fp32_s=4e-4, decode_bf16_s=2e-4
)
DOC = "The council met on Tuesday and voted to build a new bridge over the river, which will open in 2027."


def test_auto_decodes_in_fp32_where_a_one_token_step_is_slower_in_bf16(fake_cpu):
    fake_cpu(AMX_SLOW_DECODE)
    assert prec.resolve_precision("auto") == "bf16"
    assert prec.resolve_decode_precision("auto", "auto") == "fp32"
    assert prec.resolve_decode_precision("bf16", "auto") == "fp32"  # a caller's resolved bf16: the decode rule holds
    assert prec.resolve_decode_precision("bf16", "bf16") == "bf16"  # named: kept
    assert prec.resolve_decode_precision("fp32", "auto") == "fp32"
    assert prec.describe_precision("auto").startswith("bf16 (decode steps in fp32; auto: ")
    assert "one-token decode step 2.5×" in prec.describe_precision("auto")
    assert prec.describe_precision("bf16").startswith("bf16 (chosen: ")  # an explicit choice serves both phases
    fake_cpu(AMX_FAST_DECODE)
    assert prec.resolve_decode_precision("auto", "auto") == "bf16"
    assert prec.describe_precision("auto").startswith("bf16 (auto: ")


def test_topl_precision_and_gpus_decode_in_the_precision_of_the_prompt(fake_cpu, monkeypatch):
    fake_cpu(AMX_SLOW_DECODE)
    monkeypatch.setenv(prec.PRECISION_ENV, "bf16")
    assert prec.resolve_decode_precision("auto", "auto") == "bf16"
    monkeypatch.delenv(prec.PRECISION_ENV)
    monkeypatch.setattr(prec, "cuda_bf16", lambda: True)
    assert prec.resolve_decode_precision("auto", "auto", "cuda") == "bf16"  # GPU weights are bf16: no cast per call
    # a probe cached before the decode probe existed decides both phases as before
    old = prec.Bf16Probe(capability="AMX", amx=True, avx512_bf16=True, fp32_s=7e-4, bf16_s=1e-4)
    fake_cpu(old)
    assert prec.resolve_decode_precision("auto", "auto") == "bf16"


def test_configs_a_person_chose_keep_an_explicit_precision_for_both_phases(fake_cpu):
    fake_cpu(AMX_SLOW_DECODE)
    assert GenerationConfig.chosen("bf16").decode_on("cpu") == "bf16"
    assert GenerationConfig.chosen("auto").decode_on("cpu") == "fp32"
    assert GenerationConfig(precision="bf16").decode_on("cpu") == "fp32"
    # EvalConfig resolves both when built, so its generation cache key records what ran
    assert (EvalConfig().precision, EvalConfig().generation.decode_precision) == ("bf16", "fp32")
    assert EvalConfig(precision="bf16", decode_precision="bf16").generation.decode_precision == "bf16"
    with pytest.raises(ValueError, match="decode_precision='fp16'"):
        GenerationConfig(decode_precision="fp16")


def test_a_reproduction_saves_the_decode_precision_its_generations_use(fake_cpu):
    """ReproduceConfig resolves the decode steps' precision with the prompt's when built and hands it to every
    evaluation; a study saved before the field existed reads back as the same config (its resume is not refused)."""
    from topl_core.analysis.studies.reproduce_config import ReproduceConfig
    from topl_core.foundations.errors import ConfigError

    fake_cpu(AMX_SLOW_DECODE)
    cfg = ReproduceConfig()
    assert (cfg.precision, cfg.decode_precision) == ("bf16", "fp32")
    assert cfg.to_json()["decode_precision"] == "fp32" and cfg.eval_config().generation.decode_on("cpu") == "fp32"
    assert ReproduceConfig(decode_precision="bf16").eval_config().decode_precision == "bf16"
    assert ReproduceConfig(precision="fp32").decode_precision == "fp32"
    saved_before = {k: v for k, v in cfg.to_json().items() if k != "decode_precision"}
    assert ReproduceConfig.from_json({**saved_before, "precision": "bf16"}) == cfg
    with pytest.raises(ConfigError, match="decode_precision='fp16'"):
        ReproduceConfig(decode_precision="fp16")


def test_a_probe_cached_before_the_decode_probe_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path))
    prec.cpu_bf16_probe.cache_clear()
    try:
        path = tmp_path / "machine" / f"bf16-{machine_key()}.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"capability": "X", "amx": False, "avx512_bf16": False, "fp32_s": 1, "bf16_s": 2}))
        probe = prec.cpu_bf16_probe()
        assert probe.decode_fp32_s > 0 and probe.decode_bf16_s > 0 and probe.decode_kind == prec.DECODE_KIND
        assert json.loads(path.read_text())["decode_bf16_s"] == probe.decode_bf16_s
        # a probe of the decode step as it ran before the bf16 weights were kept (autocast's cast at every call)
        old = {**json.loads(path.read_text()), "decode_bf16_s": 1.0, "decode_kind": None}
        path.write_text(json.dumps(old))
        prec.cpu_bf16_probe.cache_clear()
        assert prec.cpu_bf16_probe().decode_bf16_s < 1.0  # measured again
    finally:
        prec.cpu_bf16_probe.cache_clear()


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def _autocast_per_forward(model, run) -> list[tuple[int, bool]]:
    """(new positions, autocast on) of every forward `run` makes."""
    seen: list[tuple[int, bool]] = []

    def record(_module, _args, kwargs):
        seen.append((kwargs["input_ids"].shape[-1], torch.is_autocast_enabled("cpu")))

    # the decoder inside the causal LM: its forward runs inside the autocast the loop enters around the LM's
    handle = model.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("decode", ["fp32", "bf16"])
def test_each_phase_runs_in_its_precision_and_both_paths_agree(tiny, decode):
    """bf16 for the prompt and `decode` for each new token, in a batch of documents (generate: left-padded rows) and
    in the streamed loop alike, and the two write the same tokens."""
    cfg = GenerationConfig(max_new_tokens=6, precision="bf16", decode_precision=decode)
    batched: list[str] = []
    phases = _autocast_per_forward(tiny.model, lambda: batched.extend(generate(tiny, [DOC], cfg)))
    streamed: list[str] = []
    phases_streamed = _autocast_per_forward(tiny.model, lambda: streamed.extend(stream_generate(tiny, DOC, cfg)))
    assert batched[0] == streamed[-1]
    for seen in (phases, phases_streamed):
        (prompt_len, prompt_bf16), *steps = seen
        assert prompt_len > 1 and prompt_bf16 and steps
        assert all(n == 1 and on == (decode == "bf16") for n, on in steps), seen
    assert not torch.is_autocast_enabled("cpu")  # nothing left switched on
