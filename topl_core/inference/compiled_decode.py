"""Decode steps compiled once (issue 40: the slider's decode loop; docs/performance.md, "The decode loop's options").

    decoder = CompiledDecoder(lm, shift_paths=("model.layers.8.mlp.down_proj", ...))
    decoder.supports(cfg) -> bool                  whether a stream under `cfg` decodes here (else decode eagerly)
    decoder.stream(prefix, cfg, shifts) -> Iterator[str]   stream_generate's texts from `prefix`, every decode step
        with shifts[path] added to the output of the module at `path` (a steering vector times λ; absent: zero)

A private module tree sharing the model's weights (what is registered on it never touches the model), with one
forward hook per shift path adding a float32 tensor set in place, and a static KV cache per length bucket (the prompt
and the new tokens rounded up to BUCKET positions), into which each stream copies its prompt's cache. torch.compile
builds one graph per bucket, on the first stream of that length (13–38 s for SmolLM2 on a 2-core CPU), and every later
stream of the bucket reuses it, whatever the shifts (no recompile per λ). Buckets, not one large cache: attention and
its mask span the whole cache, and 1,024 positions for a 618-position stream cost most of what compiling saves.
Decode steps run in the weights' own dtype (float32 on a CPU; bf16 where a GPU loaded bf16 weights), never under
autocast. On a GPU the step is compiled with CUDA graphs ("reduce-overhead": the cache and the shifts are static
addresses, so one replay per token launches every kernel of the step). A compiled step can round differently from
the eager one in the last bits, so its greedy text could part from the eager text at a near-tie: the tests compare
them (float32 and bf16), bench --slider on SmolLM2 and the scale benchmark on the GPU.
"""

from __future__ import annotations

import copy
import threading
from typing import Iterator, Mapping, Sequence

import torch

from ..hardware.precision import TORCH_DTYPES
from ..models.loading import LoadedModel
from .generate import GenerationConfig, Prefill, decode_greedy

BUCKET = 64  # static caches hold a multiple of this many positions (docs/performance.md, the decode loop's options)


class CompiledDecoder:
    """See the module docstring. One stream at a time (a lock): the static cache is shared by every call."""

    def __init__(self, lm: LoadedModel, shift_paths: Sequence[str] = ()):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        model = lm.model
        shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
        self._model = copy.deepcopy(model, memo=shared)  # a module tree of its own over the same weights
        for module in self._model.modules():  # without the hooks the model had (none while nobody generates)
            module._forward_hooks.clear()
            module._forward_pre_hooks.clear()
        self.dtype, self._cuda = model.dtype, model.device.type == "cuda"
        self._shifts: dict[str, torch.Tensor] = {}
        for path in shift_paths:
            module = self._model.get_submodule(path)
            shift = torch.zeros(module.weight.shape[0], dtype=torch.float32, device=model.device)
            torch._dynamo.mark_static_address(shift)  # set in place before each stream: no copy into a CUDA graph
            module.register_forward_hook(lambda _m, _i, output, shift=shift: output + shift.to(output.dtype))
            self._shifts[path] = shift
        self._caches: dict[int, StaticCache] = {}  # by capacity
        self._new_cache = lambda capacity: StaticCache(config=model.config, max_cache_len=capacity)
        # sliding-window layers keep a window, not the prompt's every position: not copied into here
        self.compilable = all(type(layer) is StaticLayer for layer in self._new_cache(BUCKET).layers)
        mode = "reduce-overhead" if self._cuda else None  # CUDA graphs: no launch per kernel, no Python per module
        self._step = torch.compile(self._model.forward, dynamic=False, mode=mode)
        self._lm, self._lock = lm, threading.Lock()

    def supports(self, cfg: GenerationConfig) -> bool:
        """Whether a stream under `cfg` decodes here: greedy, the decode steps in the weights' dtype (float32 weights
        for fp32 steps, bf16 weights for bf16 steps), no sliding windows."""
        decode = cfg.decode_on(self._lm.model.device.type)
        return self.compilable and TORCH_DTYPES[decode] == self.dtype and cfg.mode == "greedy"

    @torch.no_grad()
    def stream(self, prefix: Prefill, cfg: GenerationConfig, shifts: Mapping[str, torch.Tensor]) -> Iterator[str]:
        """stream_generate's texts from `prefix` (the same model's prompt), each decode step with `shifts` added."""
        if not self.supports(cfg):
            raise ValueError(f"{cfg}: not a stream the compiled decoder runs (greedy, decode steps in {self.dtype})")
        unknown = set(shifts) - set(self._shifts)
        if unknown:
            raise ValueError(f"no shift registered at {sorted(unknown)}; known: {sorted(self._shifts)}")
        tok, device = self._lm.tokenizer, self._lm.model.device
        capacity = -(-(prefix.length + cfg.max_new_tokens) // BUCKET) * BUCKET
        with self._lock:
            if capacity not in self._caches:
                self._caches[capacity] = self._new_cache(capacity)
            cache = self._caches[capacity]
            for path, shift in self._shifts.items():
                if path in shifts:
                    shift.copy_(shifts[path])
                else:
                    shift.zero_()
            cache.reset()
            for layer, (keys, values, *_) in zip(cache.layers, prefix.cache):
                layer.update(keys.to(self.dtype), values.to(self.dtype))  # the prompt's positions, then the steps'
            position = prefix.length - 1

            def step(ids: torch.Tensor) -> torch.Tensor:
                nonlocal position
                position += 1
                at = torch.tensor([position], device=device)
                if self._cuda:
                    torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read: free to reuse
                out = self._step(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=at)
                return out.logits[:, -1].float().clone()  # a graph's output buffer is overwritten by the next replay

            for texts in decode_greedy(tok, prefix.logits[None], cfg.max_new_tokens, step):
                yield texts[0]
