"""The service's decode step compiled ahead of time: one forward over a few slots, each row at its own position with its
own steering shifts, as an AOTInductor package (aot_packages.py) — what serve/batch.py runs on a CPU, once the package
of its rows and cache length is built, instead of the eager Python forward.

    step = BatchStep(lm, slots=16, shift_paths=residual_paths(model), read_layer=head.layer, dtype=decode_dtype)
    step.supports() -> bool                   on a CPU, decoding in the weights' dtype or bf16 over float32 weights
                                              (bf16 autocast's step, written out: models/forward.bf16_step_tree; 2 rows,
                                              or 2, 4 and 8 in bf16), no sliding windows
    step.shape(rows, full, capacity) -> Shape | None   the package a step of `rows` rows runs in, of which the first
        `full` need their logits: (a bucket of ROW_BUCKETS, capacity, the rows running every layer), None: eager
    step.shapes(capacity) -> [Shape]          every package of a cache length, the one-client step's first
    step.ready(shape) / step.warm_later(shape)   built and loaded / built by a child process and loaded after, in a
        background thread (nothing waits for it: the batcher steps eagerly meanwhile)
    logits, hidden = step(shape, storage, ids, positions, allowed, shifts)   rows = ids' rows (the shape's): each
        row's token at its position, attending to the positions `allowed` marks (rows × capacity, its own included),
        shifts[i] (rows × width) added to the output of the module at shift_paths[i]; the next logits of the first
        `full` rows (full × vocabulary, float32) and every row's hidden state after decoder layer `read_layer` (rows ×
        width: where the adapter's head reads p(good)). `storage`: each layer's (keys, values), slots × heads ×
        capacity × head size, in the weights' dtype: the batcher's own, written in place at each row's position (no
        copy).
    python -m topl_core.inference.batch_step NAME DTYPE OUT SLOTS ROWS CAPACITY READ_LAYER ATTENTION FULL DECODE
        [PATH ...]   the child (DECODE: float32 or bfloat16, what the steps decode in)

The rows past `full` stop at the head's layer (models/forward.first_rows_above): an unsteered twin, read there only,
runs the layers up to the head's (21 of SmolLM2's 30 for the demo adapter) and no LM head. A twin takes the slot after
its generation's, so one client's twin is the step's last row and runs so.

The rows are fixed per package: traced for a known row count, each linear is a row product per row, fused by inductor
(hardware/linear_kernel.rows_product); with a dynamic row count they called oneDNN's linear through Python, and
SmolLM2's two-row step took 93 ms against 79 eagerly and 47 so (docs/performance.md, "The service's compiled step").
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from ..hardware.linear_kernel import ROW_PRODUCT_ROWS
from ..models.architecture import decoder_layers
from ..models.forward import first_rows_above
from ..models.loading import LoadedModel, ModelSpec, load_model
from ..models.one_query_attention import own_attention
from .aot_packages import AotPackages, StepModule, bind, export_package, step_constants

# the row counts packages are built for (a step's rows, the highest slot in use + 1, rounded up: the others sit out);
# more rows run eagerly. A float32 step stops at ROW_PRODUCT_ROWS: past it the compiled step was no faster
# (hardware/linear_kernel.py); a bf16 step's larger buckets take aten's bf16 linear (SmolLM2 on a 2-core Zen 4 EPYC:
# 4 rows 34.6 ms a step against 47.3 eagerly, 8 rows 54.9 against 55.5). A larger bucket runs every row through every
# layer: one package, not one per count of rows needing logits (a twin between two clients' rows could not stop early)
ROW_BUCKETS = (2, 4, 8)


def attention_mask4d(allowed: torch.Tensor, attention: str) -> torch.Tensor:
    """rows × positions allowed (bool) → rows × 1 × 1 × positions, as the attention takes it: sdpa a boolean mask,
    eager an additive one (0 or the float32 minimum)."""
    allowed = allowed[:, None, None, :]
    if own_attention(attention) == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, torch.finfo(torch.float32).min)


class RowLayer(StaticLayer):
    """A static cache layer of one row per slot that writes each row's keys and values at that row's `position`
    (set before each forward: an input of the step) and gives attention the batch's rows."""

    position: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows = key_states.shape[0]  # the step's, or its first rows' above the head's layer
        each, at = torch.arange(rows, device=key_states.device), self.position[:rows]
        self.keys[each, :, at] = key_states[:, :, 0].to(self.keys.dtype)
        self.values[each, :, at] = value_states[:, :, 0].to(self.values.dtype)
        return self.keys[:rows], self.values[:rows]

    def get_seq_length(self) -> int:
        return 0  # unused: the step gives its positions and a 4-D mask


class BatchDecodeStep(StepModule):
    """The exported module (the module docstring): its own module tree over the model's weights, a RowLayer cache of
    `slots` rows and `capacity` positions, shift hooks, the hidden state after layer `read_layer` captured, and the
    layers above it running the first `full` rows only (None: every row)."""

    def __init__(
        self,
        model: torch.nn.Module,
        slots: int,
        capacity: int,
        shift_paths: Sequence[str],
        read_layer: int,
        attention: str,
        full: int | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(model, slots, capacity, RowLayer, shift_paths, dtype)
        self.attention = attention
        self._read: dict[str, torch.Tensor] = {}
        decoder_layers(self.model)[read_layer].register_forward_hook(self._capture)
        if full is not None:
            first_rows_above(self.model, read_layer, full)

    def _capture(self, _module, _inputs, output) -> None:
        self._read["hidden"] = output[0] if isinstance(output, tuple) else output

    def forward(self, ids, position, allowed, *shifts):
        self._start_step(position, shifts)
        mask = attention_mask4d(allowed, self.attention)
        out = self.model(input_ids=ids, past_key_values=self.cache, attention_mask=mask, position_ids=position[:, None])
        return out.logits[:, -1].float(), self._read["hidden"][:, -1]

    def example_inputs(self, rows: int) -> tuple[torch.Tensor, ...]:
        capacity, device = self.key_cache_0.shape[2], self.key_cache_0.device
        ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        position = torch.zeros(rows, dtype=torch.long, device=device)
        allowed = torch.ones(rows, capacity, dtype=torch.bool, device=device)
        return (ids, position, allowed, *(torch.zeros(rows, n, device=device) for n in self.shift_sizes))


def build_package(name: str, dtype: str, out: Path, slots: int, rows: int, capacity: int, args: Sequence[str]) -> None:
    """The child's work: export the batched step of the model `name` for `rows` rows, and compile it."""
    read_layer, attention, full, decode, *shift_paths = args
    model = load_model(ModelSpec(name, dtype, "cpu")).model
    step = BatchDecodeStep(
        model, slots, capacity, shift_paths, int(read_layer), attention, int(full), getattr(torch, decode)
    )
    export_package(step, step.example_inputs(rows), out)


# a package's rows, cache length, and first rows running every layer (the module docstring)
Shape = tuple[int, int, int]


class BatchStep:
    """The batched steps of one model, one package per row bucket and cache length (the module docstring).
    warm_later, ready and state may be called from any thread; the step itself from the batcher's thread only."""

    def __init__(
        self, lm: LoadedModel, slots: int, shift_paths: Sequence[str], read_layer: int, dtype: torch.dtype | None = None
    ):
        self._lm, self.slots, self.paths = lm, slots, tuple(shift_paths)
        self.dtype = dtype or lm.model.dtype  # what the steps decode in
        bf16_step = self.dtype == torch.bfloat16 and lm.model.dtype == torch.float32
        self._attention = lm.model.config._attn_implementation
        # whether rows may stop at the read layer: below the last one (a head's), else nothing is left to skip
        self._cut = read_layer < len(decoder_layers(lm.model)) - 1
        self._buckets = tuple(b for b in ROW_BUCKETS if b <= self.slots and (b <= ROW_PRODUCT_ROWS or bf16_step))
        decode = str(self.dtype).removeprefix("torch.")
        self._args = [
            str(slots),
            "{rows}",
            "{capacity}",
            str(read_layer),
            self._attention,
            "{full}",
            decode,
            *self.paths,
        ]
        self._packages = AotPackages(lm, __name__)
        self._read_layer = read_layer
        self._lock, self._one_build = threading.Lock(), threading.Lock()
        self._runners: dict[Shape, object] = {}  # loaded packages
        self._bound: dict[Shape, tuple[int, ...]] = {}  # the storage each package was handed (its data_ptrs)
        self._building: set[Shape] = set()
        self.failed: dict[Shape, Exception] = {}  # a shape whose build failed is not tried again

    @functools.cached_property
    def _constants(self) -> dict[str, torch.Tensor]:
        """The tensors a package reads, by name, from a step of one position (its cache is not the one the package
        reads): the model's weights, or under a bf16 step their kept bf16 copies."""
        one = BatchDecodeStep(self._lm.model, 1, 1, self.paths, self._read_layer, self._attention, dtype=self.dtype)
        return step_constants(one)

    def supports(self) -> bool:
        """Whether these steps run here: on a CPU, in the weights' own dtype or bf16 over float32 weights, without
        sliding windows."""
        cache = StaticCache(config=self._lm.model.config, max_cache_len=1)
        plain = all(type(layer) is StaticLayer for layer in cache.layers)
        model = self._lm.model
        kinds = (model.dtype, torch.bfloat16) if model.dtype == torch.float32 else (model.dtype,)
        return plain and model.device.type == "cpu" and self.dtype in kinds and self.bucket(1) is not None

    def bucket(self, rows: int) -> int | None:
        """The rows of the package a step of `rows` rows runs in (the others sit out), None past the last bucket."""
        return next((b for b in self._buckets if rows <= b), None)

    def shape(self, rows: int, full: int, capacity: int) -> Shape | None:
        """The package a step of `rows` rows runs in, the first `full` of them needing their logits (the rest read at
        the read layer only); None past the last bucket (the step runs eagerly)."""
        bucket = self.bucket(rows)
        if bucket is None:
            return None
        return bucket, capacity, full if full in self._full_counts(bucket) else bucket

    def shapes(self, capacity: int) -> list[Shape]:
        """Every package of a cache length: per bucket, each count of rows running every layer, fewest first (one
        client's steered row and its twin, the step most often asked for)."""
        return [(b, capacity, full) for b in self._buckets for full in self._full_counts(b)]

    def _full_counts(self, bucket: int) -> Sequence[int]:
        """The counts of rows running every layer that a bucket has packages for: each where rows may stop at the
        read layer (the row products' buckets), else all of them (ROW_BUCKETS)."""
        return range(1, bucket + 1) if self._cut and bucket <= ROW_PRODUCT_ROWS else (bucket,)

    def ready(self, shape: Shape) -> bool:
        return shape in self._runners

    def state(self) -> dict:
        """The (rows, cache length) whose package is loaded, building, or failed (with why)."""
        with self._lock:
            return {
                "ready": sorted(self._runners),
                "building": sorted(self._building),
                "failed": [[*shape, str(e)] for shape, e in sorted(self.failed.items())],
            }

    def warm_later(self, shape: Shape) -> None:
        """The package of `shape` built (a child process) and loaded, in a background thread (once)."""
        if self._claim(shape):
            threading.Thread(target=self._warm, args=(shape,), name="topl-batch-step-build", daemon=True).start()

    def warm(self, shape: Shape) -> None:
        """The package of `shape` built and loaded now (waiting for a build another call started)."""
        if self._claim(shape):
            self._warm(shape)
        while shape in self._building:
            time.sleep(0.1)

    def _claim(self, shape: Shape) -> bool:
        """Whether this call builds `shape` (not built, not building, not failed)."""
        with self._lock:
            if shape in self._runners or shape in self._building or shape in self.failed:
                return False
            self._building.add(shape)
            return True

    def _warm(self, shape: Shape) -> None:
        rows, capacity, full = shape
        args = [a.format(rows=rows, capacity=capacity, full=full) for a in self._args]
        try:
            with self._one_build:  # one child at a time: each takes every core it can
                runner = self._packages.load(self._packages.key(*args), args)  # its constants: at the first step
        except Exception as e:  # the batcher goes on eagerly at this shape
            self.failed[shape] = e
        else:
            self._runners[shape] = runner
        finally:
            with self._lock:
                self._building.discard(shape)

    def __call__(self, shape: Shape, storage, ids, positions, allowed, shifts):
        runner = self._runners[shape]
        bound = tuple(t.data_ptr() for kv in storage for t in kv)
        if self._bound.get(shape) != bound:  # the batcher's storage was allocated anew: hand it over
            constants = dict(self._constants)
            for i, (keys, values) in enumerate(storage):
                constants[f"key_cache_{i}"], constants[f"value_cache_{i}"] = keys, values
            bind(runner, constants)
            self._bound[shape] = bound
        return runner(ids, positions, allowed, *shifts)


if __name__ == "__main__":
    name, dtype, out, slots, rows, capacity, *args = sys.argv[1:]
    build_package(name, dtype, Path(out), int(slots), int(rows), int(capacity), args)
