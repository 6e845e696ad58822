"""Decode steps compiled ahead of time in a child process: the Steering slider on a CPU (docs/performance.md, "The
exported step").

    decoder = ExportedDecoder(lm, shift_paths=("model.layers.8.mlp.down_proj", ...))
        the calls of compiled_decode.StepDecoder: supports, capacity, ready, warm, stream
    decoder.warm(capacity)   the step of that length: the package an earlier build left in cache/decode-steps/, else
        built by a child process at the lowest CPU priority (torch.export, then AOTInductor: about a minute for
        SmolLM2 on 2 cores; docs/performance.md, "Figures behind the code's choices"). The app's interpreter stays
        free meanwhile: a build inside it (torch.compile) holds the interpreter's lock for seconds at a time, and the
        page's eager streams stall behind it.
    Each build is an idle child (foundations/idle_children.py): stopped while the app generates or runs a page.
    python -m topl_core.inference.exported_decode NAME DTYPE CAPACITY OUT [PATH ...]   the child

The package holds code, no weights (aot_inductor.package_constants_in_so off). The parent hands it its own tensors
(load_constants, user-managed: no copy): the merged model's weights and a KV cache per length, into which each stream
copies its prompt's. So one package serves every adapter of an architecture; its file is named by what the code
depends on (package_key). The steering shifts are inputs of every call, and each step writes its keys and values at
its position, an input too, never at a counter kept in a buffer: AOTInductor folds what depends on constants alone
once, and a counter buffer is one (it came back as 1 after every step when tried).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import torch
import transformers
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from ..foundations.cache_usage import enforce_cap, touch
from ..foundations.errors import ModelError
from ..foundations.idle_children import idle_child
from ..foundations.paths import cache_dir
from ..foundations.trusted_files import checksum_path, private_folder, record_checksum, trusted
from ..hardware.linear_kernel import KERNEL_ENV, model_linear_kernel
from ..models.loading import LoadedModel, ModelSpec, load_model
from .compiled_decode import StepDecoder, private_tree
from .generate import Prefill

BUILD_TIMEOUT_S = 1800  # a child building longer than this is stopped (SmolLM2's takes about a minute: performance.md)


class PositionedLayer(StaticLayer):
    """A static cache layer that writes the step's keys and values at `position` (set before each forward: the
    step's input) and reports it as the length seen, so the causal mask and the rotary positions follow it."""

    position: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.position, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self.position, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_seq_length(self) -> torch.Tensor:
        return self.position[0]


class DecodeStep(torch.nn.Module):
    """One decode step of `model` (its own module tree, over the model's weights) with a static KV cache of
    `capacity` positions: forward(ids (1 × 1), position (1,), *shifts) -> the next logits (1 × vocabulary, float32),
    shifts[i] added to the output of the module at shift_paths[i]."""

    def __init__(self, model: torch.nn.Module, capacity: int, shift_paths: Sequence[str]):
        from transformers.integrations.executorch import get_head_shapes

        super().__init__()
        self.model = private_tree(model)
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        heads, head_dim = get_head_shapes(model.config.get_text_config())
        self.cache.early_initialization(1, heads, head_dim, model.dtype, model.device)
        for i, layer in enumerate(self.cache.layers):
            layer.__class__ = PositionedLayer
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
        self._shifts: tuple[torch.Tensor, ...] = ()
        self.shift_sizes = []
        for i, path in enumerate(shift_paths):
            module = self.model.get_submodule(path)
            module.register_forward_hook(lambda _m, _i, output, i=i: output + self._shifts[i].to(output.dtype))
            self.shift_sizes.append(module.weight.shape[0])

    def forward(self, ids: torch.Tensor, position: torch.Tensor, *shifts: torch.Tensor) -> torch.Tensor:
        self._shifts = shifts
        for layer in self.cache.layers:
            layer.position = position
        out = self.model(input_ids=ids, past_key_values=self.cache, position_ids=position[None], use_cache=True)
        return out.logits[:, -1].float()

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        device = self.key_cache_0.device
        zeros = (torch.zeros(n, device=device) for n in self.shift_sizes)
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        position = torch.zeros(1, dtype=torch.long, device=device)
        return (ids, position, *zeros)

    def constants(self) -> dict[str, torch.Tensor]:
        """Every tensor the package reads, by the name export gave it (tied weights under each of their names)."""
        named = dict(self.named_parameters(remove_duplicate=False))
        named.update(self.named_buffers(remove_duplicate=False))
        return named

    def load(self, prefix: Prefill) -> None:
        """The prompt's keys and values into the cache's first positions (the later ones are masked until written)."""
        for layer, (keys, values, *_) in zip(self.cache.layers, prefix.cache):
            layer.keys[:, :, : prefix.length] = keys
            layer.values[:, :, : prefix.length] = values


def package_key(lm: LoadedModel, capacity: int, shift_paths: Sequence[str]) -> str:
    """What a package's code depends on: the architecture (the config), the weights' dtype, the linears' kernel,
    the shift sites, the length, this module's and the libraries' code, and the CPU's instruction set."""
    kernel = model_linear_kernel(lm.model)
    parts = (lm.model.config.to_json_string(), str(lm.model.dtype), kernel, *shift_paths, str(capacity))
    parts += (_code_hash(), torch.__version__, transformers.__version__, torch.backends.cpu.get_cpu_capability())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


@functools.cache
def _code_hash() -> str:
    """This module's source, hashed once: a package built by other code is not taken for this code's."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def build_package(name: str, dtype: str, capacity: int, out: Path, shift_paths: Sequence[str]) -> None:
    """The child's work: export the step of the model `name` (its weights only lend their shapes) and compile it."""
    model = load_model(ModelSpec(name, dtype, "cpu")).model
    step = DecodeStep(model, capacity, shift_paths)
    with torch.no_grad():
        program = torch.export.export(step, args=step.example_inputs(), strict=True)
    partial = out.with_name(f"{out.stem}.{os.getpid()}.partial.pt2")
    config = {"aot_inductor.package_constants_in_so": False}
    torch._inductor.aoti_compile_and_package(program, package_path=str(partial), inductor_configs=config)
    os.replace(partial, out)  # whole or absent: a killed build leaves no package


def _child_of_this_process() -> None:
    """In the child before it runs: the lowest CPU priority, and killed with its parent (Linux), so a build nobody
    will load does not take the cores after the app is stopped (SIGKILL: a stopped build ignores SIGTERM)."""
    os.nice(19)
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ExportedDecoder(StepDecoder):
    """A StepDecoder whose steps are AOTInductor packages built by a child process (the module docstring)."""

    shifts_every_site = True  # the package is kept on disk for every later session of the model

    def __init__(self, lm: LoadedModel, shift_paths: Sequence[str] = ()):
        if lm.model.device.type != "cpu":
            raise ValueError("ExportedDecoder decodes on a CPU; on a GPU use CompiledDecoder (CUDA graphs)")
        super().__init__(lm, shift_paths)
        self._steps: dict[int, tuple[object, DecodeStep, tuple[torch.Tensor, ...]]] = {}
        self._failed: dict[int, ModelError] = {}  # a build that failed is not tried again by this decoder
        self._said: set[str] = set()  # why a folder or a package was not trusted: said once

    def package_path(self, capacity: int) -> Path:
        """Where the package of `capacity`'s step is kept (by package_key): cache/decode-steps/ where no one but this
        user can write it (compiled code is loaded from there), else this user's own private folder, saying why."""
        folder, why = private_folder(cache_dir() / "decode-steps", "decode-steps")
        if why is not None:
            self._say(why)
        if folder is None:
            raise ModelError(f"no private folder for the compiled decode step ({why}); its streams decode eagerly.")
        return folder / f"{package_key(self._lm, capacity, self._paths)}.pt2"

    def _say(self, why: str) -> None:
        if why not in self._said:
            self._said.add(why)
            warnings.warn(why, RuntimeWarning, stacklevel=3)

    def package(self, capacity: int) -> Path:
        """The package of `capacity`'s step, built by a child process first where none is on disk (one build of a
        package at a time across processes: another process's build is waited for, then loaded)."""
        out = self.package_path(capacity)
        if out.exists():
            return out
        if capacity in self._failed:
            raise self._failed[capacity]
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not out.exists():
                self._build_package(capacity, out)
                record_checksum(out)  # checked at every load (trusted_files.trusted)
                enforce_cap("decode-steps")  # the least recently used out first; this one's lock is held: kept
        return out

    def _build_package(self, capacity: int, out: Path) -> None:
        spec = self._lm.spec
        command = [sys.executable, "-m", __name__, spec.name, spec.dtype, str(capacity), str(out), *self._paths]
        env = {**os.environ, KERNEL_ENV: model_linear_kernel(self._lm.model)}  # the model the child loads: this one's
        child = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own: stopped whole (idle_child)
            preexec_fn=_child_of_this_process,
        )
        with idle_child(child):  # stopped while the app is busy (foundations/idle_children.py)
            try:
                _, err = child.communicate(timeout=BUILD_TIMEOUT_S)
                why = f"exit {child.returncode}: {err.strip()[-1500:]}"
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
                why = f"stopped after {BUILD_TIMEOUT_S} s"
        if not out.exists():
            self._failed[capacity] = ModelError(
                f"building the exported decode step of {spec.name} ({capacity} positions) failed ({why}). Its "
                "streams decode eagerly; TOPL_COMPILED_DECODE=0 stops the app from trying."
            )
            raise self._failed[capacity]

    def warm(self, capacity: int) -> None:
        """The step of `capacity`: its package built (a child process, no lock held here), then loaded."""
        if capacity not in self._built:
            self.package(capacity)
        super().warm(capacity)

    def _build(self, capacity: int) -> None:
        path = self.package(capacity)
        if why := trusted(path):  # not private, or not the bytes its build left: built again, once
            self._say(f"{why}; building it again")
            path.unlink(missing_ok=True)
            checksum_path(path).unlink(missing_ok=True)
            path = self.package(capacity)
            if why := trusted(path):
                raise ModelError(f"the compiled decode step is not loaded: {why}; its streams decode eagerly.")
        touch(path)  # used now: the cache's cap evicts it after the packages unused longer
        try:
            runner = torch._inductor.aoti_load_package(str(path))
        except Exception:  # a corrupt or foreign file under the package's name: built again, once
            path.unlink(missing_ok=True)
            runner = torch._inductor.aoti_load_package(str(self.package(capacity)))
        step = DecodeStep(self._lm.model, capacity, self._paths)
        constants = step.constants()
        wanted = {n: constants[n] for n in runner.get_constant_fqns()}
        runner.load_constants(wanted, check_full_update=True, user_managed=True)  # no copy: the model's own tensors
        self._steps[capacity] = (runner, step, step.example_inputs()[2:])  # the shift inputs, set per stream

    def _prepare(self, prefix: Prefill, capacity: int, shifts: Mapping[str, torch.Tensor]) -> None:
        _, step, inputs = self._steps[capacity]
        step.load(prefix)
        self._set_shifts(inputs, shifts)

    def _step(self, capacity: int, position: int, ids: torch.Tensor) -> torch.Tensor:
        runner, _, shifts = self._steps[capacity]
        return runner(ids, torch.tensor([position]), *shifts)


if __name__ == "__main__":
    build_package(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:])
