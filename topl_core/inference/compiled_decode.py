"""Decode steps compiled once: the Steering slider's decode step (docs/performance.md, "The decode loop's options").

StepDecoder is what every such decoder does (the calls below, its step run by the one decode loop of decode.py, one
stream at a time); CompiledDecoder, here, builds its steps with torch.compile in this process (a GPU's, with CUDA
graphs); exported_decode.ExportedDecoder has a child process build them ahead of time (a CPU's: a build here would hold
the interpreter's lock).

    decoder = CompiledDecoder(lm, shift_paths=("model.layers.8.mlp.down_proj", ...))
    decoder.supports(cfg) -> bool                  whether a stream under `cfg` decodes here (else decode eagerly)
    decoder.stream(prefix, cfg, shifts, wait=True) -> Iterator[str]   stream_generate's texts from `prefix`, every
        decode step with shifts[path] added to the output of the module at `path` (a steering vector times λ; absent:
        zero); wait=False: DecoderBusy instead of building the graph or waiting for the decoder
    decoder.key(prompt_length, cfg) -> (capacity, dtype)   the step a stream decodes in: its length bucket
        (capacity(prompt_length, max_new)) and what it decodes in (cfg's decode precision)
    decoder.warm(key) / .ready(key)                    build a step ahead (a background thread) / is it built

A private module tree sharing the model's weights (what is registered on it never touches the model), with one
forward hook per shift path adding a float32 tensor set in place, and a static KV cache per length bucket (the prompt
and the new tokens rounded up to BUCKET positions), into which each stream copies its prompt's cache. torch.compile
builds one graph per bucket, on the first stream of that length (tens of seconds for SmolLM2 on 2 cores:
docs/performance.md, "Figures behind the code's choices"), and every later stream of the bucket reuses it, whatever the
shifts (no recompile per λ). Buckets, not one large cache: attention and
its mask span the whole cache, and 1,024 positions for a 618-position stream cost most of what compiling saves.
Decode steps run in the weights' own dtype (float32 on a CPU; bf16 where a GPU loaded bf16 weights), never under
autocast. On a GPU the step is compiled with CUDA graphs ("reduce-overhead": the cache and the shifts are static
addresses, so one replay per token launches every kernel of the step). A compiled step can round differently from
the eager one in the last bits (its fused operators; its one-row float32 linears on a CPU are multiply-reduces:
hardware/linear_kernel.py), so its greedy text could part from the eager text at a near-tie: the tests compare them
(float32 and bf16), bench --slider on SmolLM2 and the scale benchmark on the GPU.
"""

from __future__ import annotations

import copy
import threading
from typing import Iterator, Mapping, Sequence

import torch

from ..hardware.precision import TORCH_DTYPES
from ..models.loading import LoadedModel
from .decode import decode, decoded_texts, stop_tokens
from .generate import GenerationConfig, Prefill

BUCKET = 64  # static caches hold a multiple of this many positions (docs/performance.md, the decode loop's options)
StepKey = tuple[int, torch.dtype]  # a step's cache length (a multiple of BUCKET) and the dtype it decodes in


class StepDecoder:
    """What a decoder of one compiled step per length does (the module docstring): the streams it takes, their
    lengths, the loop, one stream at a time (a lock: a length's cache is shared by every call). A subclass builds a
    length's step (_build), loads a stream's prompt and shifts into it (_prepare) and runs it (_step)."""

    # whether the step should shift every steerable site (a step kept across sessions: one serves any choice of
    # sites) rather than only those of the session's vectors
    shifts_every_site = False

    def __init__(self, lm: LoadedModel, shift_paths: Sequence[str] = ()):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        self._lm, self._paths = lm, tuple(shift_paths)
        self._device = lm.model.device
        self.dtypes: tuple[torch.dtype, ...] = (lm.model.dtype,)  # what its steps decode in (a subclass may add)
        # sliding-window layers keep a window, not the prompt's every position: not copied into a static cache
        cache = StaticCache(config=lm.model.config, max_cache_len=BUCKET)
        self.compilable = all(type(layer) is StaticLayer for layer in cache.layers)
        self._built: set[StepKey] = set()  # the steps built
        self._lock = threading.Lock()

    def supports(self, cfg: GenerationConfig) -> bool:
        """Whether a stream under `cfg` decodes here: its decode steps in one of `dtypes` (the weights' own: float32
        weights for fp32 steps, bf16 weights for bf16 steps; an exported step also bf16 over float32 weights), no
        sliding windows; greedy or sampled (the loop chooses, not the step)."""
        return self.compilable and self._decode_dtype(cfg) in self.dtypes

    def _decode_dtype(self, cfg: GenerationConfig) -> torch.dtype:
        return TORCH_DTYPES[cfg.decode_on(self._device.type)]

    def key(self, prompt_length: int, cfg: GenerationConfig) -> StepKey:
        """The step a stream of `prompt_length` positions under `cfg` decodes in."""
        return self.capacity(prompt_length, cfg.max_new_tokens), self._decode_dtype(cfg)

    @staticmethod
    def capacity(prompt_length: int, max_new_tokens: int) -> int:
        """The static cache (and step) a stream of this length decodes in: the positions rounded up to BUCKET."""
        return -(-(prompt_length + max_new_tokens) // BUCKET) * BUCKET

    def ready(self, key: StepKey) -> bool:
        """Whether the step `key` is built (a stream of its length and dtype starts decoding at once)."""
        return key in self._built

    @torch.no_grad()
    def warm(self, key: StepKey) -> None:
        """Build the step `key` now: what the first stream of its length and dtype would otherwise do. Only this
        decoder's lock is held: the model's own generation goes on meanwhile."""
        with self._lock:
            self._ensure(key)

    def _ensure(self, key: StepKey) -> None:
        """The step `key` built (the lock held)."""
        if key not in self._built:
            self._build(key)
            self._built.add(key)

    @torch.no_grad()
    def stream(
        self, prefix: Prefill, cfg: GenerationConfig, shifts: Mapping[str, torch.Tensor], wait: bool = True
    ) -> Iterator[str]:
        """stream_generate's texts from `prefix` (the same model's prompt), each decode step with `shifts` added. With
        `wait` False, DecoderBusy is raised before the first text when the step of this length is not built yet or
        another stream or warm() holds the decoder (the caller decodes eagerly instead of waiting)."""
        if not self.supports(cfg):
            raise ValueError(f"{cfg}: not a stream the compiled decoder runs (decode steps in {self.dtypes})")
        unknown = set(shifts) - set(self._paths)
        if unknown:
            raise ValueError(f"no shift registered at {sorted(unknown)}; known: {sorted(self._paths)}")
        key = self.key(prefix.length, cfg)
        if not self._lock.acquire(blocking=wait):
            raise DecoderBusy(key)
        try:
            if not wait and key not in self._built:
                raise DecoderBusy(key)
            self._ensure(key)
            self._prepare(prefix, key, shifts)
            position = prefix.length - 1

            def step(ids: torch.Tensor) -> torch.Tensor:
                nonlocal position
                position += 1
                return self._step(key, position, ids)

            tok = self._lm.tokenizer
            steps = decode(prefix.logits[None], cfg.max_new_tokens, stop_tokens(tok), step, cfg.chooser())
            for texts in decoded_texts(tok, steps):
                yield texts[0]
        finally:
            self._lock.release()

    def _set_shifts(self, inputs: Sequence[torch.Tensor], shifts: Mapping[str, torch.Tensor]) -> None:
        """The step's shift tensors (one per shift path, in their order) set in place: shifts[path], else zero."""
        for path, shift in zip(self._paths, inputs, strict=True):
            if path in shifts:
                shift.copy_(shifts[path])
            else:
                shift.zero_()

    def _build(self, key: StepKey) -> None:
        raise NotImplementedError

    def _prepare(self, prefix: Prefill, key: StepKey, shifts: Mapping[str, torch.Tensor]) -> None:
        """The static cache of step `key` holding the prompt's keys and values, the shifts set (the lock held)."""
        raise NotImplementedError

    def _step(self, key: StepKey, position: int, ids: torch.Tensor) -> torch.Tensor:
        """One decode step of `ids` at `position`: the next logits (float32)."""
        raise NotImplementedError


class CompiledDecoder(StepDecoder):
    """torch.compile's step, built in this process (the module docstring)."""

    def __init__(self, lm: LoadedModel, shift_paths: Sequence[str] = ()):
        from transformers import StaticCache

        super().__init__(lm, shift_paths)
        model = lm.model
        self._model = private_tree(model)
        self._cuda = model.device.type == "cuda"
        self._shifts: list[torch.Tensor] = []  # one per shift path, in their order
        for path in self._paths:
            module = self._model.get_submodule(path)
            shift = torch.zeros(module.weight.shape[0], dtype=torch.float32, device=model.device)
            torch._dynamo.mark_static_address(shift)  # set in place before each stream: no copy into a CUDA graph
            module.register_forward_hook(lambda _m, _i, output, shift=shift: output + shift.to(output.dtype))
            self._shifts.append(shift)
        self._caches: dict[int, StaticCache] = {}  # by capacity
        self._new_cache = lambda capacity: StaticCache(config=model.config, max_cache_len=capacity)
        mode = "reduce-overhead" if self._cuda else None  # CUDA graphs: no launch per kernel, no Python per module
        self._compiled = torch.compile(self._model.forward, dynamic=False, mode=mode)

    def _build(self, key: StepKey) -> None:
        """A one-token prompt and one compiled step: torch.compile builds the graph of `key` on its first call."""
        ids = torch.tensor([[self._lm.tokenizer.bos_token_id or 0]], device=self._device)
        out = self._model(input_ids=ids, use_cache=True)  # the private tree, eagerly: only self._compiled compiles
        self._prepare(Prefill(out.past_key_values, out.logits[0, -1].float(), 1), key, {})
        self._step(key, 1, ids)

    def _prepare(self, prefix: Prefill, key: StepKey, shifts: Mapping[str, torch.Tensor]) -> None:
        capacity, dtype = key
        if capacity not in self._caches:
            self._caches[capacity] = self._new_cache(capacity)
        cache = self._caches[capacity]
        self._set_shifts(self._shifts, shifts)
        cache.reset()
        for layer, (keys, values, *_) in zip(cache.layers, prefix.cache):
            layer.update(keys.to(dtype), values.to(dtype))  # the prompt's positions, then the steps'

    def _step(self, key: StepKey, position: int, ids: torch.Tensor) -> torch.Tensor:
        capacity = key[0]
        at = torch.tensor([position], device=self._device)
        if self._cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read: free to reuse
        out = self._compiled(input_ids=ids, past_key_values=self._caches[capacity], use_cache=True, cache_position=at)
        return out.logits[:, -1].float().clone()  # a graph's output buffer is overwritten by the next replay


def private_tree(model: torch.nn.Module) -> torch.nn.Module:
    """A module tree of its own over the model's weights (what is registered on it never touches the model), without
    the hooks the model had (none while nobody generates)."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    tree = copy.deepcopy(model, memo=shared)
    for module in tree.modules():
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
    return tree


class DecoderBusy(Exception):
    """The compiled decoder does not take this stream now (CompiledDecoder.stream with wait=False)."""
