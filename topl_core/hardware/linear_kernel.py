"""A CPU model's linears, for the decode step: the kernel of a float32 linear over a few rows (aten's or oneDNN's,
whichever this machine runs faster, measured once and cached per machine under cache/machine/), and inside a compiled
graph a one-row product that inductor writes itself.

A decode step reads every weight once for one row per sequence, so its linears run at the memory's bandwidth, or
should: aten's float32 linear goes to MKL, whose one-row path on an AMD CPU uses one core (10–11 GB/s on a 2-core
Zen 4 EPYC where oneDNN's reaches 18–23 GB/s and llama.cpp's 35; docs/performance.md, "The decode step's linears").

    linear_kernel() -> "aten" | "onednn"     TOPL_LINEAR_KERNEL when set, else the probe's answer
    use_linear_kernel(model) -> int          the model's nn.Linear modules become FewRowLinear running linear_kernel()
                                             (the same weights; the count returned)
    model_linear_kernel(model)               the kernel a loaded model's few-row linears run
    bf16_weight(weight, packed=False)        the weight's bf16 copy, kept (plain, or in oneDNN's layout)
    time_decode_row(weight, bf16)            one row through the weight as an eager decode step runs it (the probes')

FewRowLinear computes a forward its own way only where nothing else is asked of it: float32 weights on a CPU, at most
FEW_ROWS rows, no autograd recording. Eagerly, float32 input without autocast runs the model's kernel, and under bf16
autocast the weight's kept bf16 copy in oneDNN's layout (bf16_linear: autocast's own result, without rounding every
weight at every step); every other forward (a prompt of more positions, training) is nn.Linear's own,
bit for bit. The two
kernels round differently in the last bits. A loaded model runs every eager path through the same one (generate,
streams, grids, the gated decoder), so those agree token for token; a text can part from another machine's at a
near-tie, as between any two CPUs.

Inside a graph torch.compile traces (the compiled decode step), one row is a multiply-reduce (row_product), which
inductor fuses into one kernel per linear: it read the weights at 37 GB/s where oneDNN's linear reached 30 on the
Zen 4 EPYC, and it is no call out of the graph (the opaque oneDNN operator cost ~30 µs a call there). Up to
ROW_PRODUCT_ROWS rows (the service's batched step) are row products too, one per row, which inductor fuses into one
loop loading each weight element once for every row (rows_product); more rows go
through the model's kernel (oneDNN as one opaque operator, which calls back into Python per linear), or in a bf16
step aten's bf16 linear (what autocast calls; a package calls it without Python). The compiled
step thus rounds differently from the eager one, as its other fused operators do (inference/compiled_decode.py).
A compiled bf16 step's linears hold the plain bf16 copies and round as autocast's linear does (rows_product_bf16;
models/forward.bf16_step_tree).
"""

from __future__ import annotations

import functools
import json
import os
import weakref
from typing import Literal

import torch
import torch.nn.functional as F

from ..foundations.io import write_json
from ..foundations.paths import cache_dir
from .machine import best_time, machine_key

LinearKernel = Literal["aten", "onednn"]
KERNEL_ENV = "TOPL_LINEAR_KERNEL"  # "aten" / "onednn": the kernel on this machine, overriding the probe
FEW_ROWS = 32  # up to a λ grid's decode step (session.GRID_ROWS rows); a prompt's forward has more
# the probe's weight: 48 MiB of float32, beyond a CPU's caches as a model's weights are, one row through it
PROBE_SHAPE = (12288, 1024)
# the most rows a compiled graph's linear takes as row products (rows_product): SmolLM2's batched service step of 2 rows
# took 47 ms through them against 93 through oneDNN's opaque operator and 79 eagerly; of 4 rows, 67-90 ms against 65
# eagerly (each output's reductions grow with the rows over a short 576-wide loop; Zen 4 EPYC, 2026-11-29)
ROW_PRODUCT_ROWS = 2
FASTER_BY = 1.1  # oneDNN is chosen only where it is at least this much faster: a tie is not worth other roundings


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_bf16_available() -> bool:
    """Whether oneDNN computes bf16 linears on this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; not on AVX2 alone,
    where its bf16 weight reorder refuses)."""
    return onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


# the same as one operator that torch.compile keeps opaque: inductor lowers mkldnn._linear_pointwise itself, for
# frozen weights only (an assertion otherwise), so a compiled graph's few rows (more than ROW_PRODUCT_ROWS) call
# oneDNN through this (eager calls skip the custom operator's dispatch)
_compiled_onednn_linear = torch.library.custom_op(
    "topl::onednn_linear", mutates_args=(), schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor"
)(_onednn_linear)


@_compiled_onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _time_row(linear) -> float:
    """The best one-row linear on torch's threads (machine.best_time), as a decode step runs them (a kernel that
    leaves a core idle is what the probe is there to find: MKL's one-row path on an AMD CPU uses one of two)."""
    weight, row = torch.randn(*PROBE_SHAPE), torch.randn(1, PROBE_SHAPE[1])
    return best_time(lambda: linear(row, weight, None))


@functools.lru_cache(maxsize=1)
def kernel_probe() -> dict[str, float]:
    """{"aten_s", "onednn_s"}: one row through PROBE_SHAPE in each kernel, measured once per machine and cached."""
    path = cache_dir() / "machine" / f"linear-{machine_key()}.json"
    try:
        times = json.loads(path.read_text())
        if set(times) == {"aten_s", "onednn_s"}:
            return times
    except (OSError, ValueError):
        pass  # absent or unreadable: measure (a fraction of a second, docs/performance.md, "Figures behind the
        # code's choices") and store
    times = {"aten_s": _time_row(F.linear), "onednn_s": _time_row(_onednn_linear)}
    try:
        write_json(path, times)
    except OSError:
        pass  # a read-only cache is fine: the probe is cheap
    return times


def linear_kernel() -> LinearKernel:
    """The few-row float32 linear kernel on this machine's CPU (module docstring)."""
    chosen = os.environ.get(KERNEL_ENV)
    if chosen not in (None, "", "aten", "onednn"):
        raise ValueError(f"{KERNEL_ENV}={chosen!r}: set 'aten' or 'onednn', or unset it to let the probe choose.")
    if not onednn_available():
        return "aten"
    if chosen:
        return chosen  # type: ignore[return-value]
    times = kernel_probe()
    return "onednn" if times["onednn_s"] * FASTER_BY <= times["aten_s"] else "aten"


def row_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T for one row as a multiply and a sum over the input features: inductor writes it as one fused
    reduction that reads the weight once (module docstring); eagerly it would build the product matrix."""
    y = (x.unsqueeze(-2) * weight).sum(-1)
    return y if bias is None else y + bias


def rows_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """row_product for a few rows (their count fixed when the graph is traced): each row's own, stacked, which inductor
    fuses into one loop over the weight (each element loaded once for every row). The reductions per output grow with
    the rows, so it pays for ROW_PRODUCT_ROWS rows at most; oneDNN's linear inside a compiled graph is an opaque
    operator that calls back into Python per linear (module docstring)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] == 1:
        return row_product(x, weight, bias)
    y = torch.stack([row_product(row, weight, None) for row in flat.unbind(0)])
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


# each float32 weight's bf16 forms, by the weight's id (bf16_weight): the private module trees over a model's weights
# (compiled_decode.private_tree) share them, and a weight no longer held takes them with it (a finalizer)
_BF16_WEIGHTS: dict[int, tuple[weakref.ref, int, dict[str, torch.Tensor]]] = {}


def bf16_weight(weight: torch.Tensor, packed: bool = False) -> torch.Tensor:
    """`weight` rounded to bf16 as autocast rounds it, kept: made again only after the weight changed in place (its
    version: a LoRA merged into it, a checkpoint loaded) — autocast rounds every weight again at every forward, which
    costs a one-row decode step more than its bf16 product saves (docs/performance.md, "The decode step's linears").
    `packed`: in oneDNN's own layout for its bf16 linear (where oneDNN computes bf16 here), what an eager few-row
    forward reads: the same products as aten's bf16 linear, about twice as fast for one row; a compiled step reads the
    plain copy. Each form is made the first time it is asked for."""
    packed = packed and onednn_bf16_available()
    if weight.is_inference():  # made under torch.inference_mode: no version to tell an in-place change by
        rounded = weight.to(torch.bfloat16)
        return torch.ops.mkldnn._reorder_linear_weight(rounded, 1) if packed else rounded
    kept = _BF16_WEIGHTS.get(id(weight))
    if kept is None or kept[0]() is not weight or kept[1] != weight._version:
        if kept is None or kept[0]() is not weight:
            weakref.finalize(weight, _BF16_WEIGHTS.pop, id(weight), None)
        kept = _BF16_WEIGHTS[id(weight)] = (weakref.ref(weight), weight._version, {})
    forms = kept[2]
    if "plain" not in forms:
        with torch.no_grad():
            forms["plain"] = weight.to(torch.bfloat16)
    if packed and "packed" not in forms:
        forms["packed"] = torch.ops.mkldnn._reorder_linear_weight(forms["plain"], 1)  # its batch size: a hint only
    return forms["packed" if packed else "plain"]


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A few rows through `weight` as bf16 autocast's linear computes them (every operand rounded to bf16, then bf16's
    linear), the weight's kept bf16 form read (bf16_weight): autocast's result — bit for bit where oneDNN sums the
    products as aten's bf16 linear does (so on the Zen 4 EPYC), else within bf16's last bit."""
    x, bias = x.to(torch.bfloat16), None if bias is None else bias.to(torch.bfloat16)
    if onednn_bf16_available():
        return _onednn_linear(x, bf16_weight(weight, True), bias)
    return F.linear(x, bf16_weight(weight), bias)


def time_decode_row(weight: torch.Tensor, bf16: bool) -> float:
    """One row through the float32 `weight` as an eager decode step's FewRowLinear runs it, best of the probe's
    repeats (machine.best_time): in float32 the faster of aten's and oneDNN's linear (the kernel a loaded model
    takes), in bf16 bf16_linear over the weight's kept copy. The decode probe (precision.py) compares the two."""
    row = torch.randn(1, weight.shape[1])
    if bf16:
        return best_time(lambda: bf16_linear(row, weight, None))
    aten = best_time(lambda: F.linear(row, weight))
    return min(aten, best_time(lambda: _onednn_linear(row, weight, None))) if onednn_available() else aten


def rows_product_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A few rows through a bf16 weight as bf16 autocast's linear computes them: the rows rounded to bf16, the
    products summed in float32 (rows_product: the weight widened in the loop that reads it, half float32's bytes), the
    bias (rounded to bf16) added, the output rounded to bf16. The compiled steps' bf16 kind
    (models/forward.bf16_step_tree)."""
    y = rows_product(x.to(torch.bfloat16).float(), weight.float(), None)
    return (y if bias is None else y + bias.to(torch.bfloat16).float()).to(torch.bfloat16)


class FewRowLinear(torch.nn.Linear):
    """A CPU model's nn.Linear: its few-row float32 inference forwards run `kernel`, or row_product inside a compiled
    graph, and under bf16 autocast its kept bf16 weight (module docstring)."""

    kernel: LinearKernel = "aten"  # set per module by use_linear_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compiled_bf16 = self.weight.dtype == torch.bfloat16 and torch.compiler.is_compiling()
        if compiled_bf16 and x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            if x.numel() <= ROW_PRODUCT_ROWS * self.in_features:
                return rows_product_bf16(x, self.weight, self.bias)
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)  # more rows: autocast's bf16 linear
            return F.linear(x.to(torch.bfloat16), self.weight, bias)
        if (
            x.numel() <= FEW_ROWS * self.in_features
            and self.weight.dtype == torch.float32
            and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            compiling = torch.compiler.is_compiling()
            if not torch.is_autocast_enabled("cpu"):
                if x.dtype == torch.float32:
                    if compiling and x.numel() <= ROW_PRODUCT_ROWS * self.in_features:
                        return rows_product(x, self.weight, self.bias)
                    if self.kernel == "onednn":
                        linear = _compiled_onednn_linear if compiling else _onednn_linear
                        return linear(x, self.weight, self.bias)
            elif torch.get_autocast_dtype("cpu") == torch.bfloat16 and not compiling:
                return bf16_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_linear_kernel(model: torch.nn.Module) -> int:
    """Turn the model's nn.Linear modules (exactly that class) into FewRowLinear running linear_kernel(), in place,
    keeping their weights; the number turned."""
    kernel = linear_kernel()
    turned = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for module in turned:
        module.__class__ = FewRowLinear
        module.kernel = kernel
    return len(turned)


def model_linear_kernel(model: torch.nn.Module) -> LinearKernel:
    """The kernel of the model's few-row float32 linears: oneDNN where load_model turned them to it, else aten."""
    turned = (m for m in model.modules() if isinstance(m, FewRowLinear))
    return "onednn" if any(m.kernel == "onednn" for m in turned) else "aten"
