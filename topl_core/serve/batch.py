"""Step-level batching: the decode steps of many generations on one model run as one batched forward.

Each generation runs the one decode loop (inference/decode.decode) in a thread of its own; its `forward` hands its
token to the Batcher and waits. The Batcher's thread gathers the tokens of every generation that is waiting, runs one
forward over all of them — each row steered with its own mode and λ, the adapter's head read on every row — and hands
each generation its row's logits. A generation joins with its prompt (run once, alone, between two steps: a new
request's first token does not wait for the others to finish) and leaves when it ends.

    batcher = Batcher(lm, vectors, lora, head, ("bf16", "fp32"), slots=16, prompt_cache_mb=512)   the precisions of
        its prompts and of its steps (the page's under auto: resolve_phases)
    joined = batcher.join(ids, steering, twin=False).result()   the prompt run into a free slot (and its twin):
        Joined(slot, twin, logits, prompt); a join still waiting for a slot is cancelled with its future's cancel()
    logits, p = batcher.submit(slot, token, steering).result()     one decode step of `slot`, batched with others
        (a twin's logits: None where its step stopped at the head's layer)
    batcher.crop(slot, n)                         the slot's last n positions dropped (a judge took a token back)
    batcher.leave(slot)
    batcher.idle()                                every slot free, nothing waiting (the service's invariant at rest)

A prompt's forward is kept in the prompt cache (serve/prompts.py): a prompt asked for again decodes at once. A twin's
prompt runs only through the head's layer: it is read there, and nothing above it is ever asked of it (its slot's
layers above hold zeros). Its steps do too in the compiled step, where the twin is the last row (one client's: its
slot is the one after its generation's); an eager step runs every row through every layer, a twin's upper ones unread.

A slot belongs to the generation whose join took it from the moment it is taken: a prompt that fails gives its slots
back before the join's future raises, and a generation gives them back when it ends, however it ends.

The KV cache holds every slot's keys and values in one storage (slots × heads × capacity × head size); a slot writes
each position at its own index (its length: slots of different lengths share a step), and the attention mask hides
the positions a slot does not hold (a crop, or a step it sat out). Rotary positions are each slot's own. A model with
sliding-window layers (Gemma-3) keeps every position in those layers too; their mask holds each row's own window.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from transformers.cache_utils import Cache

from ..foundations.errors import ModelError
from ..hardware.precision import TORCH_DTYPES, ResolvedPrecision, autocast
from ..hardware.threads import release_this_threads_team
from ..inference.aot_packages import compiled_decode_wanted
from ..inference.batch_step import BatchStep, attention_mask4d
from ..inference.prompt_cache import PromptCache
from ..models.architecture import decoder_layers
from ..models.forward import Head, HeadReader
from ..models.loading import LoadedModel
from ..models.one_query_attention import own_attention
from ..runtime.hooks import edit_outputs
from ..runtime.sites import LoraWeights, Site, residual_paths
from ..runtime.vectors import SteeringVectors
from .echo import PromptScores
from .prompts import PromptForwards
from .row_steering import RowSteering, Steering
from .slots import SlotLayer

ROOM = 256  # the cache grows by this many positions at a time
PROMPT_CACHE_MB = 512  # the prompt forwards kept for prompts asked for again (SmolLM2: ~46 KB a position)
GATHER_S = 0.002  # how long a step waits for the generations still choosing their token


@dataclass(frozen=True)
class Joined:
    """A prompt run into its slot: the slot, its twin (None: none), the first new token's logits (vocabulary,
    float32), and the prompt's own scores when the join asked for them."""

    slot: int
    twin: int | None
    logits: torch.Tensor
    prompt: PromptScores | None = None


@dataclass(frozen=True)
class _Join:
    ids: torch.Tensor
    steering: Steering
    twin: bool
    score: int | None  # None: the prompt is not scored; else the number of alternatives per position
    done: Future

    @property
    def rows(self) -> int:
        return 1 + self.twin


@dataclass
class _Step:
    slot: int
    token: int
    steering: Steering
    done: Future


class Batcher:
    """The batched forwards of many generations (the module docstring). Thread-safe; one thread runs the model."""

    def __init__(
        self,
        lm: LoadedModel,
        vectors: SteeringVectors,
        lora: Callable[[], Mapping[Site, LoraWeights]],
        head: Head | None,
        precisions: tuple[ResolvedPrecision, ResolvedPrecision],
        slots: int = 16,
        prompt_cache_mb: int = PROMPT_CACHE_MB,
    ):
        text = lm.model.config.get_text_config()
        sliding = "sliding_attention" in (getattr(text, "layer_types", None) or ())
        # a sliding-window layer sees the last `window` positions before each row's own: its mask is per row
        self._window: int | None = text.sliding_window if sliding else None
        self._attention = lm.model.config._attn_implementation
        if self._window is not None and own_attention(self._attention) not in ("sdpa", "eager"):
            raise ModelError(
                f"{lm.spec.name}: its sliding-window layers are served with the sdpa or eager attention, not "
                f"{self._attention!r}; load it with attn_implementation='sdpa'."
            )
        self.lm, self.head = lm, head
        self.prompt_precision, self.precision = precisions  # the prompts', the steps'
        layers = len(decoder_layers(lm.model))
        # the layers a twin's prompt runs through (None: all of them)
        self._twin_through = head.layer if head is not None and head.layer < layers - 1 else None
        self.slots = slots
        self._prompts = PromptForwards(lm, vectors, lora, head, self.prompt_precision, prompt_cache_mb * 2**20)
        self.prompts: PromptCache = self._prompts.cache
        self.write_at = torch.zeros(slots, dtype=torch.long)  # each slot's next position (= its length)
        self.write_at_step = self.write_at
        self.length = 1
        self._mask = torch.zeros(slots, ROOM, dtype=torch.long)
        self._free = list(range(slots))  # a heap: the lowest free slot first, so the batch's rows stay few
        self._cache = Cache(layers=[SlotLayer(self) for _ in decoder_layers(lm.model)])
        self._cond = threading.Condition()
        self._steps: dict[int, _Step] = {}
        self._joins: list[_Join] = []
        self._joined: set[int] = set()  # slots holding a generation
        self._twins: set[int] = set()  # those holding a twin: read at the head's layer, their logits never asked for
        self._rows = RowSteering(lm.model, vectors, lora)
        self.compiled = self._compiled_step(lm, head, self.precision)
        self.forwards: Counter[str] = Counter()  # the steps run: "compiled" or "eager"
        # the dtype the steps write keys and values in: the weights' under an fp32 step, bf16 under a bf16 one (a bf16
        # prompt's widened on a CPU's fp32 weights, as the page's cache is by its fp32 steps)
        self._kv_dtype = lm.model.dtype if self.precision == "fp32" else TORCH_DTYPES[self.precision]
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="topl-serve-batcher", daemon=True)
        self._thread.start()
        release_this_threads_team()  # the batcher's thread runs every forward from now on (hardware/threads.py)

    def _compiled_step(self, lm: LoadedModel, head: Head | None, precision: ResolvedPrecision) -> BatchStep | None:
        """The compiled step where it applies (a CPU decoding in the weights' dtype or in bf16 over float32 weights,
        no sliding windows, slots for its smallest bucket; TOPL_COMPILED_DECODE=0: never), reading the hidden state
        where the head reads p(good)."""
        if self._window is not None or not compiled_decode_wanted():
            return None
        read_layer = head.layer if head is not None else len(decoder_layers(lm.model)) - 1
        step = BatchStep(lm, self.slots, residual_paths(lm.model), read_layer, TORCH_DTYPES[precision])
        return step if step.supports() else None

    def warm(self, positions: int, wait: bool = False) -> bool:
        """Build the compiled steps (each row bucket) of the storage holding `positions` ahead of the requests (else
        a shape's first step starts its build; eager steps meanwhile); `wait`: until loaded. Whether they are."""
        if self.compiled is None:
            return False
        shapes = self.compiled.shapes(-(-positions // ROOM) * ROOM)
        for shape in shapes:
            (self.compiled.warm if wait else self.compiled.warm_later)(shape)
        return all(self.compiled.ready(shape) for shape in shapes)

    # the generations' side
    def join(self, ids: torch.Tensor, steering: Steering, twin: bool = False, score: int | None = None) -> Future:
        """Run the prompt `ids` (1 × positions) into a free slot when one is free: a future of Joined. `twin`: a
        second slot holding the same prompt unsteered (the merged model's reading of the same tokens: where the
        head's p(good) is read for a steered generation). `score`: the prompt's own tokens scored too, with that many
        alternatives each (PromptScores). Cancelling the future while it waits withdraws the join."""
        if 1 + twin > self.slots:
            raise ValueError(f"this join takes {1 + twin} slots; the batcher has {self.slots}.")
        done: Future = Future()
        with self._cond:
            self._joins.append(_Join(ids, steering, twin, score, done))
            self._cond.notify_all()
        return done

    def submit(self, slot: int, token: int, steering: Steering) -> Future:
        """One decode step of `slot` with `token`, batched with the other slots' waiting steps; the future gives (the
        next logits (vocabulary,), float32, or None for a twin whose step stopped at the head's layer; the head's
        p(good) of `token`, NaN without a head)."""
        done: Future = Future()
        with self._cond:
            self._steps[slot] = _Step(slot, token, steering, done)
            self._cond.notify_all()
        return done

    def crop(self, slot: int, n: int) -> None:
        """Drop the slot's last `n` positions (between its forwards)."""
        with self._cond:
            end = int(self.write_at[slot])
            self._mask[slot, end - n : end] = 0
            self.write_at[slot] = end - n

    def leave(self, slot: int) -> None:
        with self._cond:
            self._mask[slot] = 0
            self.write_at[slot] = 0
            self._joined.discard(slot)
            self._twins.discard(slot)
            self._steps.pop(slot, None)
            if slot not in self._free:
                heapq.heappush(self._free, slot)
            self._cond.notify_all()

    def idle(self) -> bool:
        """Every slot free and nothing waiting to join or step (what the service holds whenever nothing runs)."""
        with self._cond:
            waiting = [j for j in self._joins if not j.done.cancelled()]
            free = len(self._free) == self.slots and not self._joined and not self._twins
            return free and not self._steps and not waiting

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(10)

    # the model's thread
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._steps or self._can_join())
                if self._stopping:
                    return
                # a step waits a moment for the generations still choosing their token, not for one that is joining
                self._cond.wait_for(lambda: len(self._steps) >= len(self._joined), GATHER_S)
                steps, self._steps = self._steps, {}
                join, slots = self._take_join()
            if steps:
                self._step(list(steps.values()))
            if join is not None:
                try:
                    joined = self._prefill(slots, join)
                except BaseException as e:  # the slots go back before the generation hears of it
                    for slot in slots:
                        self.leave(slot)
                    join.done.set_exception(e)
                else:
                    join.done.set_result(joined)

    def _can_join(self) -> bool:
        while self._joins and self._joins[0].done.cancelled():  # withdrawn while waiting
            self._joins.pop(0)
        return bool(self._joins) and len(self._free) >= self._joins[0].rows

    def _take_join(self) -> tuple[_Join | None, list[int]]:
        """The first waiting join that slots are free for, its future marked running, with the slots it now owns."""
        while self._can_join():
            join = self._joins.pop(0)
            if join.done.set_running_or_notify_cancel():
                return join, [heapq.heappop(self._free) for _ in range(join.rows)]
        return None, []

    def _prefill(self, slots: list[int], join: _Join) -> Joined:
        """The prompt (steered where the mode steers the prompt) into the first slot, unsteered into the second (the
        twin, through the head's layer) if any — each from the prompt cache when it holds that forward — and its own
        tokens scored if asked (serve/prompts.py)."""
        ids, steering = join.ids, join.steering
        steered = steering if steering.how.steers_prompt and not steering.neutral else None
        scores, twin = None, steered is not None and len(slots) > 1
        if join.score is not None:
            held, last, scores = self._prompts.scored(ids, steered, join.score)
            plain = self._prompts.run(ids, None, self._twin_through)[0] if twin else held
        elif twin:
            held, last, plain = self._prompts.run_with_twin(ids, steered, self._twin_through)
        else:
            held, last = self._prompts.run(ids, steered)
            plain = held
        n = ids.shape[1]
        with self._cond:
            self._ensure_room(n + 1, held[0][0])
            for slot, kept in zip(slots, (held, plain)):
                for i, layer in enumerate(self._cache.layers):
                    if i < len(kept):
                        layer.keys[slot, :, :n], layer.values[slot, :, :n] = kept[i][0][0], kept[i][1][0]
                    else:  # above a twin's last layer: nothing is read there
                        layer.keys[slot, :, :n], layer.values[slot, :, :n] = 0, 0
            for slot in slots:
                self._mask[slot] = 0
                self._mask[slot, :n] = 1
                self.write_at[slot] = n
                self._joined.add(slot)
            self._twins.update(slots[1:])
        return Joined(slots[0], slots[1] if len(slots) > 1 else None, last.clone(), scores)

    def _ensure_room(self, positions: int, like: torch.Tensor) -> None:
        """Room for `positions` in every slot (under the lock). With no slot holding a generation, the storage is
        sized anew for `positions` alone: one long prompt does not keep every slot long after it ends."""
        held, needed = self._mask.shape[1], -(-positions // ROOM) * ROOM
        if not self._joined and held != needed:
            for layer in self._cache.layers:
                layer.keys = layer.values = None
            self._mask = torch.zeros(self.slots, 0, dtype=torch.long)
            held = 0
        if self._cache.layers[0].keys is not None and positions <= held:
            return
        capacity = max(held, needed)
        for layer in self._cache.layers:
            layer.allocate(like, self.slots, capacity, self._kv_dtype)
        mask = torch.zeros(self.slots, capacity, dtype=torch.long)
        mask[:, :held] = self._mask
        self._mask = mask

    def _step(self, steps: list[_Step]) -> None:
        """One batched forward of the waiting steps; the other joined slots sit it out (a masked write). The compiled
        step runs it where one is built and loaded for its rows (rounded up to a bucket: the free slots up to it sit
        out too) and the storage's length, and every row's steering is a shift. There, the rows after the last one
        whose logits are asked for (twins, and slots sitting out) stop at the head's layer."""
        try:
            with self._cond:
                rows = max(max(s.slot for s in steps), *self._joined, 0) + 1
                full = 1 + max((s.slot for s in steps if s.slot not in self._twins), default=0)
                self._ensure_room(int(self.write_at[:rows].max()) + 1, self._cache.layers[0].keys)
                capacity = self._mask.shape[1]
                shape = self.compiled.shape(rows, full, capacity) if self.compiled is not None else None
                if shape is not None and not self.compiled.ready(shape):
                    self.warm(capacity)  # every package of this length: more clients are likely to come
                    shape = None  # eagerly meanwhile, unpadded
                rows = shape[0] if shape is not None else rows
                write_at, mask = self.write_at[:rows].clone(), self._mask[:rows].clone()
            ids = torch.zeros(rows, 1, dtype=torch.long)
            for s in steps:
                ids[s.slot, 0] = s.token
            mask[torch.arange(rows), write_at] = 1  # a slot sitting out attends to its own (discarded) write
            steering = {s.slot: s.steering for s in steps}
            shifts = self._rows.shifts(rows, steering, self.compiled.paths) if shape is not None else None
            if shifts is not None:
                logits, p = self._compiled_forward(shape, ids, write_at, mask, shifts)
            else:
                logits, p = self._eager_forward(rows, ids, write_at, mask, steering)
            self.forwards["eager" if shifts is None else "compiled"] += 1
            with self._cond:
                for s in steps:
                    self._mask[s.slot, write_at[s.slot]] = 1
                    self.write_at[s.slot] = write_at[s.slot] + 1
            for s in steps:  # a twin past the rows running every layer has no logits
                s.done.set_result((logits[s.slot] if s.slot < len(logits) else None, float(p[s.slot])))
        except BaseException as e:
            for s in steps:
                if not s.done.done():
                    s.done.set_exception(e)

    def _eager_forward(self, rows, ids, write_at, mask, steering) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's forward in Python (the rows' edits hooked on the model): each row's next logits (float32) and
        p(good) (NaN without a head)."""
        self.write_at_step, self.length = write_at, int(write_at.max()) + 1
        model, device = self.lm.model, self.lm.model.device
        reader = HeadReader(model, self.head, rows)
        edits = self._rows.edits(rows, steering)
        with edit_outputs(model, edits, rows=rows), autocast(self.precision, device.type), reader:
            out = model(
                input_ids=ids.to(device),
                past_key_values=self._cache,
                attention_mask=self._step_mask(mask[:, : self.length], write_at, device),
                position_ids=write_at[:, None].to(device),
                use_cache=True,
            )
            return out.logits[:, -1].float(), reader.read()

    def _compiled_forward(self, shape, ids, write_at, mask, shifts) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's forward through the compiled package of `shape`, on the storage itself: as _eager_forward gives,
        the logits of the shape's first rows only."""
        storage = [(layer.keys, layer.values) for layer in self._cache.layers]
        logits, hidden = self.compiled(shape, storage, ids, write_at, mask.bool(), shifts)
        if self.head is None:
            return logits, torch.full((ids.shape[0],), float("nan"))
        return logits, self.head.read(self.lm.model, hidden[:, None])[:, -1]

    def _step_mask(self, held: torch.Tensor, at: torch.Tensor, device: torch.device):
        """A step's attention mask, its rows holding `held` (rows × positions) and writing at `at`: None when every
        row holds every position (attention's fast path), else `held`; with sliding-window layers a 4-D mask per kind
        of layer, the sliding layers' holding the `window` positions up to each row's own position."""
        if self._window is None:
            return None if bool(held.all()) else held.to(device)
        full = held.bool()
        sliding = full & (torch.arange(held.shape[1])[None, :] > at[:, None] - self._window)
        full, sliding = full.to(device), sliding.to(device)
        return {
            "full_attention": attention_mask4d(full, self._attention),
            "sliding_attention": attention_mask4d(sliding, self._attention),
        }
