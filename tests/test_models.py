"""Model loading: tiny families, the embedded SmolLM2, spec validation and offline errors."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import needs_smollm2

from topl_core.foundations.errors import ModelError
from topl_core.models.architecture import check_layer_range, decoder_layers
from topl_core.models.forward import first_rows_above
from topl_core.models.loading import ModelSpec, load_model
from topl_core.models.tiny import TINY_FAMILIES


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_families_load_and_run(family):
    lm = load_model(family)
    assert len(decoder_layers(lm.model)) == lm.num_layers == 4
    ids = lm.tokenizer("Police arrested two men.", return_tensors="pt")["input_ids"]
    logits = lm.model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(lm.tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_rows_past_the_first_stop_at_a_layer(family):
    """first_rows_above (the service's compiled step: twins read at the head's layer): the first row's logits and
    every row's states after the layer are the whole forward's, and the other rows never reach the layers above —
    the KV cache's upper layers hold the first row only (Gemma-3's sliding-window layers and rotary kinds too)."""
    model = load_model(family).model
    ids = torch.randint(5, 200, (3, 7), generator=torch.Generator().manual_seed(0))
    whole = model(ids, output_hidden_states=True)
    handles = first_rows_above(model, 1, 1)
    try:
        cut = model(ids, output_hidden_states=True, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    assert cut.logits.shape[0] == 1
    torch.testing.assert_close(cut.logits, whole.logits[:1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cut.hidden_states[2], whole.hidden_states[2])  # after layer 1: all three rows
    rows = [layer.keys.shape[0] for layer in cut.past_key_values.layers]
    assert rows == [3, 3, 1, 1]


def test_tiny_tokenizer_offsets_include_leading_space():
    tok = load_model("tiny-llama").tokenizer
    enc = tok("The cat sat", return_offsets_mapping=True, add_special_tokens=False)
    text = "The cat sat"
    pieces = [text[s:e] for s, e in enc["offset_mapping"]]
    assert "".join(pieces) == text
    assert any(p.startswith(" ") for p in pieces)


def test_fingerprints_differ_between_models():
    assert load_model("tiny-llama").fingerprint != load_model("tiny-qwen3").fingerprint
    assert load_model("tiny-llama").fingerprint == load_model("tiny-llama").fingerprint


def test_spec_validation_names_field():
    with pytest.raises(ModelError, match="dtype"):
        ModelSpec("tiny-llama", dtype="float16")
    with pytest.raises(ModelError, match="empty"):
        ModelSpec("  ")


def test_bfloat16_spec_gives_bf16_weights():
    lm = load_model(ModelSpec("tiny-qwen3", dtype="bf16"))
    assert next(lm.model.parameters()).dtype == torch.bfloat16


def test_unknown_model_offline_is_clear_and_fast(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    t = time.perf_counter()
    with pytest.raises(ModelError) as e:
        load_model("some-org/not-a-model")
    assert time.perf_counter() - t < 10
    msg = str(e.value)
    assert "hub is unreachable" in msg and "smollm2-135m" in msg


def test_local_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path))


def test_layer_range_outside_model():
    check_layer_range(30, 0, 29)
    with pytest.raises(ModelError, match=r"0\.\.29"):
        check_layer_range(30, 0, 30)


def test_save_pretrained_directory_round_trip(tmp_path):
    lm = load_model("tiny-llama")
    lm.model.save_pretrained(tmp_path)
    lm.tokenizer.save_pretrained(tmp_path)
    again = load_model(str(tmp_path))
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(lm.model(ids).logits, again.model(ids).logits)


@needs_smollm2
def test_embedded_smollm2_is_the_real_model():
    lm = load_model("smollm2-135m")
    cfg = lm.model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3)
    assert lm.tokenizer.chat_template
    # a real model continues a sentence sensibly: the capital of France
    ids = lm.tokenizer("The capital of France is", return_tensors="pt")
    out = lm.model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in lm.tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def _fake_split_package(site, em, chunks: list[bytes], listed_sha: str) -> None:
    """The layout the real Gemma packages install: data/SHA256SUMS in the main package, data/<file>.partNN in each
    part package (with an __init__.py, which the loader must not import or count as a part)."""
    main = site / em.package
    (main / "data").mkdir(parents=True)
    (main / "__init__.py").write_text("raise ImportError('never imported')\n")
    (main / "data" / "SHA256SUMS").write_text(f"{listed_sha}  {em.gguf_file}\n")
    for i, chunk in enumerate(chunks, start=1):
        part = site / f"{em.package}_part{i}"
        (part / "data").mkdir(parents=True)
        (part / "__init__.py").write_text("raise ImportError('never imported')\n")
        (part / "data" / f"{em.gguf_file}.part{i - 1:02d}").write_bytes(chunk)


def test_split_gguf_parts_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    import hashlib

    from topl_core.models.loading import EMBEDDED, _assemble_split_gguf, package_dir

    em = EMBEDDED["gemma3-270m"]
    chunks = [b"GGUF-first-", b"second-", b"third-", b"fourth"]
    whole = b"".join(chunks)
    site = tmp_path / "site"
    _fake_split_package(site, em, chunks, hashlib.sha256(whole).hexdigest())
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache"))
    joined = _assemble_split_gguf(package_dir(em.package), em)
    assert joined.read_bytes() == whole

    # a damaged part: refused with the reinstall command, nothing left in the cache
    bad_site = tmp_path / "bad"
    _fake_split_package(
        bad_site, em, [b"GGUF-first-", b"secXnd-", b"third-", b"fourth"], hashlib.sha256(whole).hexdigest()
    )
    monkeypatch.syspath_prepend(str(bad_site))
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path / "cache2"))
    import importlib

    importlib.invalidate_caches()
    with pytest.raises(ModelError, match="force-reinstall"):
        _assemble_split_gguf(package_dir(em.package), em)
    assert not any((tmp_path / "cache2" / "gguf").iterdir())
