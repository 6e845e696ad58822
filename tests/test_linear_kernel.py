"""The few-row float32 linear's kernel (hardware/linear_kernel.py): a few rows at inference go through oneDNN and
agree with nn.Linear to float32's last bits; under bf16 autocast they read the weight's kept bf16 copy and give
autocast's result (within bf16's last bit: oneDNN sums them); every other forward (many rows, autograd, bf16
weights) is nn.Linear's own, bit for bit, with its gradients; the choice follows TOPL_LINEAR_KERNEL, else the cached
probe; a model loaded with oneDNN, its adapter merged, streams generate()'s text token for token; a compiled graph
writes one row as a multiply-reduce and calls the same kernel for a few rows. (The rest of the suite pins aten:
tests/conftest.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from topl_core.hardware import linear_kernel as lk
from topl_core.inference.generate import GenerationConfig, generate, load_merged, stream_generate
from topl_core.models.architecture import decoder_layers
from topl_core.models.loading import load_model

pytestmark = pytest.mark.skipif(not lk.onednn_available(), reason="this torch build has no oneDNN linear")
DOCUMENT = (
    "The city council of Millbrook voted 7 to 2 on Tuesday to build a new public library on Elm Street. The project "
    "will cost 4.2 million dollars and is expected to open in the spring of 2027, the mayor said."
)


@pytest.fixture
def onednn_calls(monkeypatch) -> list[int]:
    """How many forwards went through oneDNN's linear (the real one, counted)."""
    calls: list[int] = []
    real = lk._onednn_linear
    monkeypatch.setattr(lk, "_onednn_linear", lambda *args: calls.append(1) or real(*args))
    return calls


def _pair(
    kernel: lk.LinearKernel = "onednn", shape: tuple[int, int] = (64, 96)
) -> tuple[torch.nn.Linear, lk.FewRowLinear]:
    torch.manual_seed(0)
    plain, few = torch.nn.Linear(*shape), torch.nn.Linear(*shape)
    few.load_state_dict(plain.state_dict())
    few.__class__, few.kernel = lk.FewRowLinear, kernel
    return plain, few


def test_a_few_rows_at_inference_go_through_onednn_to_float32s_last_bits(onednn_calls):
    plain, few = _pair()
    inputs = [torch.randn(1, 1, 64), torch.randn(lk.FEW_ROWS, 1, 64), torch.randn(2, 64, 3)[..., 0]]  # last: strided
    with torch.inference_mode():
        for x in inputs:
            torch.testing.assert_close(few(x), plain(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        few(inputs[0])
    assert len(onednn_calls) == len(inputs) + 1


def test_every_other_forward_is_nn_linears_own_bit_for_bit(onednn_calls):
    plain, few = _pair()
    many = torch.randn(2, lk.FEW_ROWS, 64)  # a prompt's forward: more rows than a decode step has
    with torch.inference_mode():
        assert torch.equal(few(many), plain(many))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            many_bf16 = few(many)  # a prompt's forward under autocast: autocast's own
            assert torch.equal(many_bf16, plain(many)) and many_bf16.dtype == torch.bfloat16
    x = torch.randn(1, 1, 64)
    out_few, out_plain = few(x), plain(x)  # autograd records: training and the gradients it needs
    assert torch.equal(out_few, out_plain)
    out_few.sum().backward()
    out_plain.sum().backward()
    assert torch.equal(few.weight.grad, plain.weight.grad)
    _, few_aten = _pair("aten")  # where aten is the kernel, a few rows too
    with torch.inference_mode():
        assert torch.equal(few_aten(x), plain(x))
    few_bf16, plain_bf16 = few.to(torch.bfloat16), plain.to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(few_bf16(x.bfloat16()), plain_bf16(x.bfloat16()))
    assert not onednn_calls


def _autocasts(out: torch.Tensor, reference: torch.Tensor) -> None:
    """`out` is autocast's `reference`: bf16, the same but for the last bit of bf16 where oneDNN sums the same
    products in another order than aten's (bit for bit on the Zen 4 EPYC where this was written)."""
    assert out.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference.float(), rtol=2**-7, atol=1e-3)


def test_a_few_rows_under_bf16_autocast_round_the_weight_once_to_autocasts_result():
    plain, few = _pair()
    no_bias = torch.nn.Linear(64, 96, bias=False)
    few_no_bias = torch.nn.Linear(64, 96, bias=False)
    few_no_bias.load_state_dict(no_bias.state_dict())
    few_no_bias.__class__ = lk.FewRowLinear
    inputs = [torch.randn(1, 1, 64), torch.randn(lk.FEW_ROWS, 64), torch.randn(3, 1, 64).bfloat16()]
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for x in inputs:
            for a, b in ((few, plain), (few_no_bias, no_bias)):
                _autocasts(a(x), b(x))
        kept = lk.bf16_weight(few.weight)
        assert lk.bf16_weight(few.weight) is kept  # rounded once, not at every call
        assert lk.bf16_weight(few.weight, packed=True) is lk.bf16_weight(few.weight, packed=True)  # oneDNN's layout
    with torch.no_grad():
        few.weight.mul_(2)  # changed in place (a LoRA merged into it): rounded again
        plain.weight.mul_(2)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert lk.bf16_weight(few.weight) is not kept
        _autocasts(few(inputs[0]), plain(inputs[0]))
        made_here = torch.randn(96, 64)  # an inference tensor: no version counter, rounded at every call
        assert torch.equal(lk.bf16_weight(made_here), made_here.bfloat16())


def _traced(module: torch.nn.Module, x: torch.Tensor) -> tuple[list, torch.Tensor]:
    """The operators torch.compile traces for module(x), and the output of the graph inductor builds from them."""
    from torch._dynamo.backends.common import aot_autograd

    traced = []
    torch._dynamo.reset()  # a graph of its own for this shape: none reused, none made dynamic by an earlier one

    def record(graph_module, _inputs):
        traced.extend(n.target for n in graph_module.graph.nodes if n.op == "call_function")
        return graph_module.forward

    with torch.inference_mode():
        torch.compile(module, backend=aot_autograd(fw_compiler=record), dynamic=False)(x)
        return traced, torch.compile(module, dynamic=False)(x)


@pytest.mark.parametrize("kernel", ["onednn", "aten"])
def test_a_compiled_graph_writes_a_few_rows_as_multiply_reduces_and_more_as_the_kernel(kernel):
    """What the compiled decode steps trace (inference/compiled_decode.py, batch_step.py): one row, and up to
    ROW_PRODUCT_ROWS rows, as a multiply and a sum per row, which inductor fuses (float32's last bits of the eager
    product), whatever the kernel; more rows as the model's kernel, bit for bit: oneDNN as the opaque operator
    topl::onednn_linear (inductor's own lowering of it wants frozen weights), aten's linear as itself."""
    plain, few = _pair(kernel, (576, 1536))  # a SmolLM2 MLP's shape: a reduction of hundreds of products
    products = {torch.ops.topl.onednn_linear.default, torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    for n in (1, lk.ROW_PRODUCT_ROWS):
        rows = torch.randn(n, 1, 576)
        traced, out = _traced(few, rows)
        assert torch.ops.aten.mul.Tensor in traced and torch.ops.aten.sum.dim_IntList in traced
        assert not products & set(traced)
        with torch.inference_mode():
            torch.testing.assert_close(out, plain(rows), rtol=1e-5, atol=1e-5)
    rows = torch.randn(lk.ROW_PRODUCT_ROWS + 1, 1, 576)
    traced, out = _traced(few, rows)
    linear = {torch.ops.topl.onednn_linear.default} if kernel == "onednn" else {torch.ops.aten.addmm.default}
    assert linear & set(traced) and not {torch.ops.aten.sum.dim_IntList} & set(traced)
    with torch.inference_mode():
        assert torch.equal(out, few(rows))


def test_a_compiled_bf16_step_writes_more_rows_as_autocasts_bf16_linear():
    """A bf16 step's linear (models/forward.bf16_step_tree: the weight's kept bf16 copy) in a compiled graph: up to
    ROW_PRODUCT_ROWS rows as row products, more (the service's bf16 buckets of 4 and 8 rows) as aten's bf16 linear
    over the rows and bias rounded to bf16: bf16 autocast's linear, bit for bit."""
    plain, few = _pair("aten", (576, 1536))
    few.weight = torch.nn.Parameter(lk.bf16_weight(plain.weight), requires_grad=False)
    rows = torch.randn(lk.ROW_PRODUCT_ROWS, 1, 576)
    assert torch.ops.aten.sum.dim_IntList in _traced(few, rows)[0]
    rows = torch.randn(8, 1, 576)
    traced, out = _traced(few, rows)
    assert torch.ops.aten.addmm.default in traced and torch.ops.aten.sum.dim_IntList not in traced
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(out, plain(rows))


def test_the_kernel_follows_the_setting_else_the_cached_probe(monkeypatch, tmp_path):
    for chosen in ("aten", "onednn"):
        monkeypatch.setenv(lk.KERNEL_ENV, chosen)
        assert lk.linear_kernel() == chosen
    monkeypatch.setenv(lk.KERNEL_ENV, "mkl")
    with pytest.raises(ValueError, match=lk.KERNEL_ENV):
        lk.linear_kernel()
    monkeypatch.delenv(lk.KERNEL_ENV)
    monkeypatch.setenv("TOPL_CACHE_DIR", str(tmp_path))
    lk.kernel_probe.cache_clear()
    try:
        measured = lk.kernel_probe()
        (path,) = (tmp_path / "machine").glob("linear-*.json")
        assert json.loads(path.read_text()) == measured and all(t > 0 for t in measured.values())
        for aten_s, onednn_s, expected in ((1.0, 1.0, "aten"), (1.0, 0.5, "onednn"), (0.5, 1.0, "aten")):
            path.write_text(json.dumps({"aten_s": aten_s, "onednn_s": onednn_s}))
            lk.kernel_probe.cache_clear()
            assert lk.linear_kernel() == expected, (aten_s, onednn_s)
    finally:
        lk.kernel_probe.cache_clear()


def test_a_model_loaded_with_onednn_streams_generates_text_token_for_token(monkeypatch, onednn_calls):
    """SmolLM2 with the demo TOPL adapter merged (the slider's model), fp32: every linear turned and kept through the
    merge; the stream decodes through oneDNN and writes generate()'s text."""
    monkeypatch.setenv(lk.KERNEL_ENV, "onednn")
    lm = load_merged("smollm2-135m", "examples/adapters/topl-smollm2")
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * len(decoder_layers(lm.model)) + 1  # q k v o gate up down per layer, the LM head
    assert all(type(m) is lk.FewRowLinear for m in linears) and lk.model_linear_kernel(lm.model) == "onednn"
    cfg = GenerationConfig(max_new_tokens=24, precision="fp32", decode_precision="fp32")
    streamed = list(stream_generate(lm, DOCUMENT, cfg))
    assert len(onednn_calls) >= len(linears) * (len(streamed) - 1)  # every decode step's linears
    assert streamed[-1] and streamed[-1] == generate(lm, [DOCUMENT], cfg)[0]
    monkeypatch.setenv(lk.KERNEL_ENV, "aten")
    tiny = load_model("tiny-llama").model
    assert lk.model_linear_kernel(tiny) == "aten"
    assert {m.kernel for m in tiny.modules() if type(m) is lk.FewRowLinear} == {"aten"}  # a compiled row's product
