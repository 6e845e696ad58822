"""Decode steps compiled ahead of time in a child process: the Steering slider on a CPU (docs/performance.md, "The
exported step").

    decoder = ExportedDecoder(lm, shift_paths=("model.layers.8.mlp.down_proj", ...))
        the calls of compiled_decode.StepDecoder: supports, capacity, ready, warm, stream
    decoder.warm(key)        the step of that length and dtype (compiled_decode.StepKey): the package an earlier build
        left in cache/decode-steps/, else
        built by a child process (aot_packages.py: torch.export, then AOTInductor, at the lowest CPU priority and
        stopped while the app generates; about a minute for SmolLM2 on 2 cores: docs/performance.md, "Figures behind
        the code's choices").
    python -m topl_core.inference.exported_decode NAME DTYPE OUT CAPACITY DECODE [PATH ...]   the child (DECODE:
        float32, or bfloat16 over float32 weights: bf16 autocast's step written out, models/forward.bf16_step_tree)

The parent hands the package its own tensors (no copy): the merged model's weights and a KV cache per length, into
which each stream copies its prompt's. The steering shifts are inputs of every call, and each step writes its keys and
values at its position, an input too, never at a counter kept in a buffer: AOTInductor folds what depends on constants
alone once, and a counter buffer is one (it came back as 1 after every step when tried).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence

import torch
from transformers.cache_utils import StaticLayer

from ..models.loading import LoadedModel, ModelSpec, load_model
from .aot_packages import AotPackages, StepModule, export_package, step_constants
from .compiled_decode import StepDecoder, StepKey
from .generate import Prefill


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


class DecodeStep(StepModule):
    """One decode step of `model` (its own module tree, over the model's weights) with a static KV cache of
    `capacity` positions: forward(ids (1 × 1), position (1,), *shifts) -> the next logits (1 × vocabulary, float32),
    shifts[i] added to the output of the module at shift_paths[i]; in `dtype` (StepModule)."""

    def __init__(
        self, model: torch.nn.Module, capacity: int, shift_paths: Sequence[str], dtype: torch.dtype | None = None
    ):
        super().__init__(model, 1, capacity, PositionedLayer, shift_paths, dtype)

    def forward(self, ids: torch.Tensor, position: torch.Tensor, *shifts: torch.Tensor) -> torch.Tensor:
        self._start_step(position, shifts)
        out = self.model(input_ids=ids, past_key_values=self.cache, position_ids=position[None], use_cache=True)
        return out.logits[:, -1].float()

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        device = self.key_cache_0.device
        zeros = (torch.zeros(n, device=device) for n in self.shift_sizes)
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        position = torch.zeros(1, dtype=torch.long, device=device)
        return (ids, position, *zeros)

    def load(self, prefix: Prefill) -> None:
        """The prompt's keys and values into the cache's first positions (the later ones are masked until written)."""
        for layer, (keys, values, *_) in zip(self.cache.layers, prefix.cache):
            layer.keys[:, :, : prefix.length] = keys
            layer.values[:, :, : prefix.length] = values


def build_package(name: str, dtype: str, out: Path, capacity: int, decode: str, shift_paths: Sequence[str]) -> None:
    """The child's work: export the step of the model `name` (its weights only lend their shapes) and compile it."""
    model = load_model(ModelSpec(name, dtype, "cpu")).model
    step = DecodeStep(model, capacity, shift_paths, getattr(torch, decode))
    export_package(step, step.example_inputs(), out)


class ExportedDecoder(StepDecoder):
    """A StepDecoder whose steps are AOTInductor packages built by a child process (the module docstring)."""

    shifts_every_site = True  # the package is kept on disk for every later session of the model

    def __init__(self, lm: LoadedModel, shift_paths: Sequence[str] = ()):
        if lm.model.device.type != "cpu":
            raise ValueError("ExportedDecoder decodes on a CPU; on a GPU use CompiledDecoder (CUDA graphs)")
        super().__init__(lm, shift_paths)
        if lm.model.dtype == torch.float32:
            self.dtypes = (torch.float32, torch.bfloat16)  # bf16: autocast's step over the weights' kept bf16 copies
        self._packages = AotPackages(lm, __name__)
        self._steps: dict[StepKey, tuple[object, DecodeStep, tuple[torch.Tensor, ...]]] = {}

    def _key(self, key: StepKey) -> tuple[str, list[str]]:
        """The package's key and the child's arguments for the step `key`."""
        capacity, dtype = key
        args = [str(capacity), str(dtype).removeprefix("torch."), *self._paths]
        return self._packages.key(*args), args

    def package_path(self, key: StepKey) -> Path:
        """Where the package of step `key` is kept (aot_packages.AotPackages.path)."""
        return self._packages.path(self._key(key)[0])

    def warm(self, key: StepKey) -> None:
        """The step `key`: its package built (a child process, no lock held here), then loaded."""
        if key not in self._built:
            self._packages.package(*self._key(key))
        super().warm(key)

    def _build(self, key: StepKey) -> None:
        capacity, dtype = key
        step = DecodeStep(self._lm.model, capacity, self._paths, dtype)
        runner = self._packages.load(*self._key(key), step_constants(step))
        self._steps[key] = (runner, step, step.example_inputs()[2:])  # the shift inputs, set per stream

    def _prepare(self, prefix: Prefill, key: StepKey, shifts: Mapping[str, torch.Tensor]) -> None:
        _, step, inputs = self._steps[key]
        step.load(prefix)
        self._set_shifts(inputs, shifts)

    def _step(self, key: StepKey, position: int, ids: torch.Tensor) -> torch.Tensor:
        runner, _, shifts = self._steps[key]
        return runner(ids, torch.tensor([position]), *shifts)


if __name__ == "__main__":
    build_package(sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6:])
