"""llama.cpp control vector export: the site -> layer-index rule, the GGUF keys and tensors (checked with our reader,
with gguf.GGUFReader directly, and with a Python transcription of llama.cpp's loader), and every refusal."""

from __future__ import annotations

import os
import re

import gguf
import numpy as np
import pytest

from topl_core.analysis.steering.control_vector import (
    ARCHITECTURE,
    KEY_LAYER_COUNT,
    KEY_MODEL_HINT,
    ControlVector,
    control_vector_index,
    control_vector_layers,
    model_hint_for,
    read_control_vector,
    write_control_vector,
)
from topl_core.foundations.errors import ModelError
from topl_core.runtime.sites import SUPPORTED_MODEL_TYPES, Site

HIDDEN = 8


def site(layer: int, module: str) -> Site:
    part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return Site(layer, module, f"model.layers.{layer}.{part}.{module}")


def vec(start: float, step: float = 0.25) -> np.ndarray:
    """Dyadic values: float32 sums of them are exact, so the tests can compare with ==."""
    return (start + step * np.arange(HIDDEN)).astype(np.float32)


def write_gguf(path, arch: str, tensors: dict[str, np.ndarray], kv: dict[str, object] | None = None) -> None:
    """A GGUF written with gguf.GGUFWriter directly (for files our writer would never produce)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, int(value))
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_load(path) -> tuple[int, list[float]]:
    """common_control_vector_load_one (ggml-org/llama.cpp common/common.cpp), transcribed with strength 1: returns
    (n_embd, data) with layer 1 at data[0:n_embd]; n_embd == -1 when llama.cpp would skip the file."""
    reader = gguf.GGUFReader(str(path))
    n_embd, data = -1, []
    for t in reader.tensors:
        layer_idx = -1
        name = t.name
        dotpos = name.find(".")
        if dotpos >= 0 and name[:dotpos] == "direction":
            m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", name[dotpos + 1 :])  # std::stoi
            layer_idx = int(m.group(1)) if m else -1
        if layer_idx <= 0:  # "invalid/unparsable" (< 0) and "invalid (zero)" (== 0) direction tensor layer index
            n_embd = -1
            break
        if t.tensor_type != gguf.GGMLQuantizationType.F32:  # invalid (non-F32) direction tensor type
            n_embd = -1
            break
        if any(int(d) > 1 for d in t.shape[1:]):  # ggml_n_dims(tensor) != 1
            n_embd = -1
            break
        if n_embd == -1:
            n_embd = int(t.n_elements)
        elif int(t.n_elements) != n_embd:  # does not match previous dimensions
            n_embd = -1
            break
        data.extend([0.0] * max(0, n_embd * layer_idx - len(data)))
        src = np.asarray(t.data, dtype=np.float32).reshape(-1)
        for j in range(n_embd):
            data[n_embd * (layer_idx - 1) + j] += float(src[j])  # "layer 1 at [0]"; same-layer tensors add up
    if n_embd == -1:
        data = []
    return n_embd, data


def llama_cpp_layer_vector(n_embd: int, data: list[float], il: int, n_layer: int) -> np.ndarray | None:
    """What llama_adapter_cvec::apply puts in tensors[il] (src/llama-adapter.cpp), or None when there is no tensor
    (il == 0: "there's never a tensor for layer 0"; il >= n_layer)."""
    if il < 1 or il >= n_layer:
        return None
    off = n_embd * (il - 1)
    out = np.zeros(n_embd, dtype=np.float32)
    if off + n_embd <= len(data):
        out[:] = data[off : off + n_embd]
    return out


# --- the mapping rule -------------------------------------------------------------------------------------------


def test_both_residual_modules_map_to_their_own_layer_index():
    for layer in (1, 5, 27):
        assert control_vector_index(site(layer, "down_proj")) == layer  # l_out of layer L = after its MLP add
        assert control_vector_index(site(layer, "o_proj")) == layer  # same index: the approximation
    assert control_vector_index(site(0, "down_proj")) == 0  # the rule itself; control_vector_layers refuses it


def test_sum_per_layer_and_roundtrip(tmp_path):
    a, b, c = vec(1.0), vec(-0.5, 0.5), vec(3.0, -0.125)
    site_vectors = {site(1, "o_proj"): a, site(1, "down_proj"): b, site(3, "down_proj"): c}
    directions = control_vector_layers(site_vectors, layer_count=4)
    assert list(directions) == [1, 3]
    assert all(d.dtype == np.float32 and d.shape == (HIDDEN,) for d in directions.values())
    np.testing.assert_array_equal(directions[1], a + b)
    np.testing.assert_array_equal(directions[3], c)

    path = write_control_vector(tmp_path / "steer.gguf", directions, model_hint_for("llama"), layer_count=4)
    assert path == tmp_path / "steer.gguf"
    assert sorted(os.listdir(tmp_path)) == ["steer.gguf"]  # the temp file was renamed, none left behind

    # our reader
    cv = read_control_vector(path)
    assert isinstance(cv, ControlVector)
    assert (cv.model_hint, cv.layer_count, list(cv.directions), cv.hidden_size) == ("llama", 2, [1, 3], HIDDEN)
    for i in (1, 3):
        assert cv.directions[i].dtype == np.float32
        np.testing.assert_array_equal(cv.directions[i], directions[i])

    # gguf.GGUFReader directly: exactly the keys and tensors of llama.cpp's cvector-generator
    reader = gguf.GGUFReader(str(path))
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert sorted(fields) == sorted(["general.architecture", KEY_MODEL_HINT, KEY_LAYER_COUNT])
    assert fields["general.architecture"].contents() == ARCHITECTURE == "controlvector"
    assert fields[KEY_MODEL_HINT].contents() == "llama"
    assert fields[KEY_LAYER_COUNT].contents() == 2
    assert fields[KEY_LAYER_COUNT].types == [gguf.GGUFValueType.INT32]  # gguf_set_val_i32 in cvector-generator
    assert [t.name for t in reader.tensors] == ["direction.1", "direction.3"]
    for t, i in zip(reader.tensors, (1, 3)):
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert [int(d) for d in t.shape] == [HIDDEN]
        assert t.data.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(t.data), directions[i])

    # llama.cpp's loader and apply(): the layer-L vector lands on tensors[L] = l_out of layer L, nothing elsewhere
    n_embd, data = llama_cpp_load(path)
    assert n_embd == HIDDEN
    for il in range(4):
        got = llama_cpp_layer_vector(n_embd, data, il, n_layer=4)
        if il == 0:
            assert got is None
        else:
            np.testing.assert_array_equal(got, directions.get(il, np.zeros(HIDDEN, np.float32)))


def test_overwrite_is_atomic_and_a_refused_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "sub" / "cv.gguf"
    write_control_vector(path, {2: vec(0.0)}, "qwen3")
    write_control_vector(path, {2: vec(1.0), 5: vec(2.0)}, "qwen3")
    cv = read_control_vector(path)
    assert list(cv.directions) == [2, 5] and cv.layer_count == 2
    np.testing.assert_array_equal(cv.directions[2], vec(1.0))
    before = path.read_bytes()
    with pytest.raises(ModelError):
        write_control_vector(path, {0: vec(1.0)}, "qwen3")
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == ["cv.gguf"]


# --- refusals when building / writing -----------------------------------------------------------------------------


def test_refuses_non_residual_site():
    with pytest.raises(ModelError, match=r"L2\.q_proj.*o_proj, down_proj"):
        control_vector_layers({site(2, "q_proj"): vec(0.0), site(2, "o_proj"): vec(1.0)})
    with pytest.raises(ModelError, match=r"L2\.up_proj"):
        control_vector_index(site(2, "up_proj"))


def test_refuses_mismatched_lengths_naming_both_sites(tmp_path):
    with pytest.raises(ModelError, match=r"L4\.o_proj: vector of length 6, but L3\.down_proj has length 8"):
        control_vector_layers({site(3, "down_proj"): vec(0.0), site(4, "o_proj"): np.zeros(6, np.float32)})
    with pytest.raises(ModelError, match=r"direction\.4: length 6, but the other directions have length 8"):
        write_control_vector(tmp_path / "unused.gguf", {3: vec(0.0), 4: np.zeros(6)}, "llama")


def test_refuses_unrepresentable_layers_naming_the_site(tmp_path):
    with pytest.raises(ModelError, match=r"L0\.down_proj: layer 0 cannot be carried.*direction\.0"):
        control_vector_layers({site(0, "down_proj"): vec(0.0), site(1, "down_proj"): vec(0.0)})
    with pytest.raises(ModelError, match=r"L0\.o_proj: layer 0"):
        control_vector_layers({site(0, "o_proj"): vec(0.0)})
    # llama.cpp has tensors for layers 1..n_layer-1 and silently drops direction.N for N >= n_layer
    assert list(control_vector_layers({site(3, "down_proj"): vec(0.0)}, layer_count=4)) == [3]
    with pytest.raises(ModelError, match=r"L4\.down_proj: layer 4 is beyond the model's 4 decoder layers"):
        control_vector_layers({site(4, "down_proj"): vec(0.0)}, layer_count=4)
    with pytest.raises(ModelError, match=r"direction\.0"):
        write_control_vector(tmp_path / "unused.gguf", {0: vec(0.0)}, "llama")
    with pytest.raises(ModelError, match=r"direction\.4: the model has 4 decoder layers"):
        write_control_vector(tmp_path / "unused.gguf", {4: vec(0.0)}, "llama", layer_count=4)


def test_refuses_other_bad_input(tmp_path):
    with pytest.raises(ModelError, match="No site vectors"):
        control_vector_layers({})
    with pytest.raises(ModelError, match="No directions"):
        write_control_vector(tmp_path / "x.gguf", {}, "llama")
    with pytest.raises(ModelError, match=r"L1\.down_proj: holds NaN"):
        control_vector_layers({site(1, "down_proj"): np.full(HIDDEN, np.nan)})
    with pytest.raises(ModelError, match=r"L1\.down_proj: shape \(2, 8\)"):
        control_vector_layers({site(1, "down_proj"): np.zeros((2, HIDDEN))})
    with pytest.raises(ModelError, match="is not a Site"):
        control_vector_layers({"L1.down_proj": vec(0.0)})
    with pytest.raises(ModelError, match="model_hint"):
        write_control_vector(tmp_path / "x.gguf", {1: vec(0.0)}, "")
    with pytest.raises(ModelError, match="layer_count"):
        control_vector_layers({site(1, "o_proj"): vec(0.0)}, layer_count=1)
    assert not (tmp_path / "x.gguf").exists()


# --- refusals when reading: missing, corrupt, not a control vector, llama.cpp's loader rules -----------------------


def test_read_refuses_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ModelError, match="no such control vector file"):
        read_control_vector(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes())
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        read_control_vector(junk)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        read_control_vector(empty)
    good = write_control_vector(tmp_path / "good.gguf", {1: vec(0.0), 2: vec(1.0)}, "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size - 16])  # tensor data cut short
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        read_control_vector(cut)


def test_read_refuses_a_gguf_of_another_architecture(tmp_path):
    path = tmp_path / "model.gguf"
    write_gguf(path, "llama", {"token_embd.weight": np.zeros((4, HIDDEN), np.float32)})
    with pytest.raises(ModelError, match=r"general\.architecture='llama', not a control vector"):
        read_control_vector(path)
    assert llama_cpp_load(path)[0] == -1  # llama.cpp would skip it too (the tensor name)


@pytest.mark.parametrize(
    "tensors, message",
    [
        ({"direction.0": vec(0.0)}, "layer index 0"),
        ({"direction.1": vec(0.0), "direction.0": vec(0.0)}, "layer index 0"),
        ({"direction.x": vec(0.0)}, "not named direction.<layer>"),
        ({"direction.-2": vec(0.0)}, "not named direction.<layer>"),
        ({"blk.1.attn_output.weight": vec(0.0)}, "not named direction.<layer>"),
        ({"direction.1": vec(0.0).astype(np.float16)}, "is F16, but llama.cpp reads only F32"),
        ({"direction.1": np.zeros((2, HIDDEN), np.float32)}, r"shape \(2, 8\).*must be 1-D"),
        ({"direction.1": vec(0.0), "direction.2": np.zeros(6, np.float32)}, "has 6 values, but .* have 8"),
        ({}, "holds no direction tensors"),
    ],
)
def test_read_applies_llama_cpp_loader_rules(tmp_path, tensors, message):
    path = tmp_path / "bad.gguf"
    write_gguf(path, ARCHITECTURE, tensors, {KEY_MODEL_HINT: "llama", KEY_LAYER_COUNT: max(1, len(tensors))})
    assert llama_cpp_load(path)[0] == -1  # llama.cpp skips this file ...
    with pytest.raises(ModelError, match=message):  # ... and we refuse it, saying why
        read_control_vector(path)


def test_read_accepts_what_llama_cpp_accepts(tmp_path):
    """Files llama.cpp loads although our writer never makes them: no model_hint/layer_count keys (llama.cpp reads
    no key; repeng writes layer_count as uint32), a (1, hidden) tensor (ggml_n_dims == 1), two tensors of one layer
    ("direction.2" and "direction.02": llama.cpp adds them up)."""
    path = tmp_path / "odd.gguf"
    a, b, c = vec(1.0), vec(0.5), vec(-2.0)
    write_gguf(path, ARCHITECTURE, {"direction.2": a, "direction.02": b, "direction.5": c.reshape(1, HIDDEN)})
    n_embd, data = llama_cpp_load(path)
    assert n_embd == HIDDEN
    cv = read_control_vector(path)
    assert (cv.model_hint, cv.layer_count, list(cv.directions)) == ("", 2, [2, 5])
    np.testing.assert_array_equal(cv.directions[2], a + b)
    np.testing.assert_array_equal(cv.directions[5], c)
    for i in (2, 5):
        np.testing.assert_array_equal(llama_cpp_layer_vector(n_embd, data, i, n_layer=6), cv.directions[i])

    repeng_style = tmp_path / "repeng.gguf"
    write_gguf(repeng_style, ARCHITECTURE, {"direction.1": a}, {KEY_MODEL_HINT: "mistral", KEY_LAYER_COUNT: 1})
    cv = read_control_vector(repeng_style)
    assert (cv.model_hint, cv.layer_count, list(cv.directions)) == ("mistral", 1, [1])


# --- model hints ----------------------------------------------------------------------------------------------------


def test_model_hint_for_uses_llama_cpp_architecture_names():
    expected = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
    expected |= {"gemma3": "gemma3", "gemma3_text": "gemma3"}
    for model_type, arch in expected.items():
        assert model_hint_for(model_type) == arch
    arch_names = set(gguf.MODEL_ARCH_NAMES.values())
    for model_type in SUPPORTED_MODEL_TYPES:  # every type the workbench steers has a real llama.cpp architecture
        assert model_hint_for(model_type) in arch_names, model_type
    assert model_hint_for("some_new_model") == "some_new_model"
