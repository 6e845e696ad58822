"""Precision that follows the hardware: "auto" resolves to bf16 only where the device computes it natively and fast.

bf16 autocast is a large win on a CPU with AMX and a disaster on one with AVX2 only, where PyTorch emulates bf16
(docs/models.md, "Device and precision", has the figures). So "auto" asks two things of a CPU: does it report
native bf16 (AMX tiles or AVX-512-BF16), and does a sub-second matmul probe (cached per machine under
cache/machine/) confirm bf16 is the faster of the two. On CUDA, `torch.cuda.is_bf16_supported()` decides.
Weights (ModelSpec.dtype) follow a simpler rule: bfloat16 on a GPU that supports it, float32 on CPU, where bf16
compute comes from autocast over float32 weights (merging a LoRA into bf16 weights rounds the delta away —
docs/training.md, "Merged vs unmerged logits").

TOPL_PRECISION=fp32|bf16 makes every "auto" mean that precision (the app's and every command's default; the test
suite pins fp32 this way, and forces bf16 where it tests the bf16 path). Configs resolve "auto" when they are built
(TrainConfig, ProbeSettings, EvalConfig, ModelSpec), so every run directory and cache key records the precision that
actually ran. Tensors leave torch through `to_numpy` (float32: numpy has no bfloat16).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import typing
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..foundations.io import write_json
from ..foundations.paths import cache_dir
from .linear_kernel import time_decode_row
from .machine import best_time, machine_key, one_thread

Precision = Literal["auto", "fp32", "bf16"]
ResolvedPrecision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
PRECISION_HELP = (  # the precision setting of every config and command
    "compute precision (bf16 = autocast); auto = TOPL_PRECISION when set, else bf16 only where the device computes it "
    "natively and fast (AMX / AVX-512-BF16 CPUs, CUDA), fp32 otherwise"
)
DECODE_PRECISION_HELP = (  # the decode phase's setting, where a config has one apart
    "compute precision of the one-token decode steps; auto = fp32 where precision is fp32, else the faster of bf16 "
    "and fp32 for one token on this device (measured), or TOPL_PRECISION when set"
)
TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
# the torch names that spec strings used for the weights before one vocabulary served both weights and compute
_TORCH_NAMES = {"float32": "fp32", "bfloat16": "bf16"}

PRECISION_ENV = "TOPL_PRECISION"  # "fp32" / "bf16": what "auto" means on this machine, overriding the probe
PROBE_SIZE = 256  # matmul side: a sub-second probe even where bf16 is emulated (docs/models.md, "The probe")
DECODE_PROBE_SIZE = 1024  # the decode probe's weight side: one row through a (3·size × size) float32 weight
# what the decode probe times (a cached probe of another kind is measured again): each weight's bf16 copy kept in
# oneDNN's layout (hardware/linear_kernel.bf16_weight), against the faster of aten's and oneDNN's float32 linear
DECODE_KIND = "kept bf16 weights"


@dataclass(frozen=True)
class Bf16Probe:
    """What this machine's CPU says and does about bf16: flags, and seconds per PROBE_SIZE² matmul in each dtype."""

    capability: str  # torch.backends.cpu.get_cpu_capability(), e.g. "AVX2", "AVX512", "AMX"
    amx: bool
    avx512_bf16: bool
    fp32_s: float
    bf16_s: float
    # one row through a weight as a one-token decode step's linears run it, in float32 and in bf16 (DECODE_KIND); None
    # in a probe cached before it was measured so (then measured again)
    decode_fp32_s: float | None = None
    decode_bf16_s: float | None = None
    decode_kind: str | None = None

    @property
    def slowdown(self) -> float:
        """bf16 time over fp32 time for the same matmul (> 1: bf16 is slower)."""
        return self.bf16_s / self.fp32_s

    @property
    def flags_native(self) -> bool:
        return self.amx or self.avx512_bf16

    @property
    def native(self) -> bool:
        """bf16 is native on this CPU and measured faster than fp32."""
        return self.flags_native and self.slowdown < 1.0

    @property
    def decode_native(self) -> bool:
        """A one-token decode step's linears are faster in bf16 than in fp32 here (measured; the prefill probe's
        answer when the decode probe is absent)."""
        if self.decode_fp32_s is None or self.decode_bf16_s is None:
            return self.native
        return self.native and self.decode_bf16_s < self.decode_fp32_s

    def describe(self) -> str:
        flags = "AMX" if self.amx else "AVX-512-BF16" if self.avx512_bf16 else "no AMX, no AVX-512-BF16"
        decode = ""
        if self.decode_fp32_s is not None and self.decode_bf16_s is not None:
            decode = f", a one-token decode step {self.decode_bf16_s / self.decode_fp32_s:.3g}×"
        return f"CPU {self.capability} ({flags}); bf16 matmul {self.slowdown:.3g}× the time of fp32{decode}"


def _time_matmul(dtype: torch.dtype) -> float:
    """Best of PROBE_REPEATS single-threaded matmuls (machine.one_thread)."""
    a = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    with one_thread():
        return best_time(lambda: a @ b)


def _time_decode_row(bf16: bool) -> float:
    """Best of PROBE_REPEATS single-threaded one-row linears through a float32 weight as a decode step's few-row
    linears run them (linear_kernel.time_decode_row: in bf16 over the weight's kept bf16 copy, about twice float32's
    speed for one row on a 2-core Zen 4 EPYC; rounded at every call, as autocast alone does, it was 2.8× float32's
    time: docs/performance.md, "The decode step's linears")."""
    weight = torch.randn(3 * DECODE_PROBE_SIZE, DECODE_PROBE_SIZE)
    with one_thread():
        return time_decode_row(weight, bf16)


def measure_bf16_probe() -> Bf16Probe:
    """A fresh measurement (no cache): the flags, the best of PROBE_REPEATS matmuls per dtype, and the decode-shaped
    one-row probe plain and under autocast."""
    return Bf16Probe(
        capability=torch.backends.cpu.get_cpu_capability(),
        amx=bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()),
        avx512_bf16=bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()),
        fp32_s=_time_matmul(torch.float32),
        bf16_s=_time_matmul(torch.bfloat16),
        decode_fp32_s=_time_decode_row(False),
        decode_bf16_s=_time_decode_row(True),
        decode_kind=DECODE_KIND,
    )


@functools.lru_cache(maxsize=1)
def cpu_bf16_probe() -> Bf16Probe:
    """The probe for this machine, measured once and cached on disk (cache/machine/bf16-<key>.json)."""
    path = cache_dir() / "machine" / f"bf16-{machine_key()}.json"
    try:
        cached = Bf16Probe(**json.loads(path.read_text()))
        if cached.decode_bf16_s is not None and cached.decode_kind == DECODE_KIND:
            return cached
    except (OSError, ValueError, TypeError):
        pass  # absent, unreadable or from before the decode probe: measure (a fraction of a second) and store
    probe = measure_bf16_probe()
    try:
        write_json(path, probe.__dict__)
    except OSError:
        pass  # a read-only cache is fine: the probe is cheap
    return probe


def cuda_bf16() -> bool:
    """bf16 on CUDA: supported by the visible GPU, or assumed (a config for a GPU this machine cannot see)."""
    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True


def bf16_native(device: str) -> bool:
    return cuda_bf16() if device == "cuda" else cpu_bf16_probe().native


def chosen_default() -> ResolvedPrecision | None:
    """The precision TOPL_PRECISION names ("fp32" or "bf16") for every "auto" in this process and the processes it
    starts — a machine-wide choice (and how the test suite pins fp32) — or None when it is unset or "auto"."""
    value = os.environ.get(PRECISION_ENV, "auto").strip() or "auto"
    if value not in PRECISIONS:
        raise ValueError(f"{PRECISION_ENV}={value!r}: choose one of {PRECISIONS}, or unset it (auto).")
    return None if value == "auto" else value  # type: ignore[return-value]


def resolve_decode_precision(precision: str, decode: str, device: str = "cpu") -> ResolvedPrecision:
    """The precision of the one-token decode forwards of a generation whose other forwards (prompt, training, scoring)
    run in `precision`: `decode` when it names one; for "auto", TOPL_PRECISION when set, fp32 when `precision` resolves
    to fp32, else bf16 where the decode probe measures a one-row step faster under bf16 autocast (GPUs, where weights
    are bf16 already) and fp32 where it does not (CPUs: autocast casts every float32 weight on every call)."""
    if decode != "auto":
        return resolve_precision(decode, device)
    resolved = resolve_precision(precision, device)
    if chosen_default() or resolved == "fp32" or device != "cpu":
        return resolved
    return "bf16" if cpu_bf16_probe().decode_native else "fp32"


def resolve_phases(precision: str, decode: str, device: str = "cpu") -> tuple[ResolvedPrecision, ResolvedPrecision]:
    """(the prompt's and training's precision, the decode steps') resolved for `device`: what a config that generates
    records when it is built, so that its saved values and cache keys say what ran."""
    return resolve_precision(precision, device), resolve_decode_precision(precision, decode, device)


def resolve_precision(precision: str, device: str = "cpu") -> ResolvedPrecision:
    """ "auto" → TOPL_PRECISION when set, else "bf16" where the device computes bf16 natively and fast, else "fp32".
    An explicit "bf16" on a CPU without native bf16 is kept but warned about, with the measured slowdown."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: choose one of {PRECISIONS} ('auto' follows the hardware).")
    if precision == "auto":
        precision = chosen_default() or ("bf16" if bf16_native(device) else "fp32")
    if precision == "bf16" and device == "cpu" and not cpu_bf16_probe().native:
        _warn_slow_bf16()
    return precision  # type: ignore[return-value]


@functools.lru_cache(maxsize=1)
def _warn_slow_bf16() -> None:
    probe = cpu_bf16_probe()
    warnings.warn(
        f"precision='bf16' on a CPU without fast native bf16 ({probe.describe()}): expect training and analysis to "
        f"run far slower than in fp32. Use precision 'auto' or 'fp32' here.",
        RuntimeWarning,
        stacklevel=3,
    )


def precision_word(name: str) -> str:
    """A precision as this vocabulary says it: the torch names of older spec strings ("float32", "bfloat16") read as
    fp32 / bf16; anything else is returned as given."""
    return _TORCH_NAMES.get(name, name)


def resolve_weights(precision: str, device: str = "cpu") -> ResolvedPrecision:
    """The weights' precision, in the compute's vocabulary: "auto" → bf16 on a GPU with bf16, fp32 on a CPU (bf16
    compute there is autocast's job). The torch names of older spec strings read as fp32 / bf16 (precision_word)."""
    precision = precision_word(precision)
    if precision not in PRECISIONS:
        raise ValueError(f"weights precision {precision!r}: choose one of {PRECISIONS} ('auto' follows the hardware).")
    if precision == "auto":
        return "bf16" if device == "cuda" and cuda_bf16() else "fp32"
    return precision  # type: ignore[return-value]


def weights_for(precision: str) -> Precision:
    """The weights a computation in `precision` loads: fp32 for fp32 compute; else "auto", i.e. bf16 on a GPU with
    bf16 (an 8B model's fp32 weights would take 32 GB and, under autocast, a bf16 copy of each for backward) and fp32
    on a CPU (where bf16 compute is autocast over fp32 weights)."""
    return "fp32" if precision_word(precision) == "fp32" else "auto"


def describe_precision(requested: str, device: str = "cpu") -> str:
    """One line for CLIs and pages: what ran and why, e.g. "fp32 (auto: CPU AVX2 (no AMX, …); bf16 … 68× …)", or
    "bf16 (decode steps in fp32; auto: …)" where auto picks each phase's faster precision apart."""
    resolved = resolve_precision(requested, device)
    decode = resolve_decode_precision(requested, "auto", device) if requested == "auto" else resolved
    decoding = "" if decode == resolved else f"decode steps in {decode}; "
    why = (
        ("GPU bf16 support" if cuda_bf16() else "GPU without bf16") if device == "cuda" else cpu_bf16_probe().describe()
    )
    if requested == "auto" and chosen_default():
        return f"{resolved} ({decoding}auto: {PRECISION_ENV}={resolved}; the hardware: {why})"
    return f"{resolved} ({decoding}{'auto' if requested == 'auto' else 'chosen'}: {why})"


def autocast(precision: str, device: str):
    """bf16 autocast when the (resolved) precision is bf16; a no-op context otherwise."""
    return torch.autocast(
        device_type=device, dtype=torch.bfloat16, enabled=resolve_precision(precision, device) == "bf16"
    )


def full_precision(device: str):
    """Autocast switched off inside a bf16 region: float32 arithmetic for small exact work (a hook's projection onto
    LoRA-A, a head's probability, the LM head's log-probs) whose inputs the caller casts with `.float()`. The meta
    device (training.memory's shape-only step, which stands bf16 weights in for autocast) has none to switch off."""
    if device == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, enabled=False)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The one way tensors leave torch: detached, on the CPU, as float32 (numpy has no bfloat16; a bf16 tensor from
    an autocast region raised "Got unsupported ScalarType BFloat16")."""
    return t.detach().to(device="cpu", dtype=torch.float32).numpy()
