"""The service's engine: each requested completion is a Generation — a thread running the one decode loop
(inference/decode.decode, with the mode's judge where it has one) whose forwards the Batcher batches with every other
generation's — and what a client reads of it: text as it comes, each token with its log-probability and the adapter's
p(good), what a judge replaced, why it ended.

    engine = ServeEngine(session, precision="fp32", slots=16, waiting=32)
    generation = engine.start(prompt_ids, Steering(how, λ), Sampling(...), on_chunk)   raises Busy when the queue
        is full; on_chunk(Chunk) is called from the generation's thread after every new piece of text
    generation.cancel()                    a client that went away: its generation stops at its next step

p(good) is read where the Token overlay reads it: the adapter's head on the merged model's (unsteered) hidden states
of the prompt and the text so far. A steered generation's forwards are steered, so it decodes with a twin slot in the
batch that reads the same tokens unsteered (the Batcher's `twin`); an unsteered one reads its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..analysis.lora_a.probe import STEERING_TOKEN_RECORDS, ProbeSettings, labelled_split
from ..analysis.steering.extract import build_steering_vectors
from ..analysis.steering.hooks import SteeringSwitch
from ..analysis.steering.session import SteeringSession
from ..analysis.token_colors import FLAG_THRESHOLD
from ..hardware.precision import Precision, resolve_precision
from ..inference.decode import decode, stop_tokens
from ..inference.generate import GenerationCancelled, GenerationConfig
from ..training.adapters import open_adapter
from .batch import Batcher, Steering


class Busy(Exception):
    """Every slot is taken and the queue of waiting generations is full (the client should retry later)."""


@dataclass(frozen=True)
class Sampling:
    """How a completion is decoded: greedy or sampled (temperature, top_p, seed), its length and stop strings."""

    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def config(self) -> GenerationConfig:
        if self.temperature == 0:
            return GenerationConfig(max_new_tokens=self.max_tokens)
        top_p = min(max(self.top_p, 0.01), 1.0)
        return GenerationConfig(
            max_new_tokens=self.max_tokens, mode="sample", temperature=self.temperature, top_p=top_p
        )


@dataclass(frozen=True)
class TokenVerdict:
    """One generated token: its text, id, log-probability under the generating (steered) model, and the adapter's
    p(good) of it (None without a head)."""

    token: str
    token_id: int
    logprob: float
    p_good: float | None


@dataclass(frozen=True)
class TakenBack:
    """A token a gated mode's judge took back: its position, the token and what the steered forward chose there
    (`replaced`: another token), with both p(good) as the judge read them."""

    position: int
    original: str
    replacement: str
    replaced: bool
    p_good: float
    p_good_after: float | None


@dataclass(frozen=True)
class Chunk:
    """What a generation adds at once: text, its tokens, the judge's take-backs among them, and, in the last chunk,
    why it ended ("stop": a stop token or string; "length": max_tokens) with the token counts."""

    text: str = ""
    tokens: tuple[TokenVerdict, ...] = ()
    taken_back: tuple[TakenBack, ...] = ()
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class _Progress:
    """A generation's running state: per generated position, the log-probability and p(good) (index = position)."""

    logprob: list[float] = field(default_factory=list)
    p_good: list[float] = field(default_factory=list)
    fed: int = 0  # positions run through the model (a judge's take-back moves it back)
    accepted: int = 0  # tokens yielded by the loop so far
    p_own: float = float("nan")  # the head's reading of the last forward's own (steered) row: what a judge reads
    emitted: int = 0  # tokens handed to the client
    text: str = ""  # the text handed to the client
    taken_back: int = 0  # take-backs handed to the client


class Generation:
    """One completion (the module docstring)."""

    def __init__(
        self,
        engine: "ServeEngine",
        ids: torch.Tensor,
        steering: Steering,
        sampling: Sampling,
        on_chunk: Callable[[Chunk], None],
    ):
        self.engine, self.ids, self.steering, self.sampling = engine, ids, steering, sampling
        self._on_chunk = on_chunk
        self._cancel = threading.Event()
        self.prompt_tokens = ids.shape[1]
        self.threshold = float(steering.how.tau) if steering.how.spec.judge is not None else FLAG_THRESHOLD
        self._thread = threading.Thread(target=self._run, name="topl-serve-generation", daemon=True)

    def cancel(self) -> None:
        self._cancel.set()

    def _run(self) -> None:
        batcher, tok = self.engine.batcher, self.engine.tokenizer
        spec, cfg = self.steering.how.spec, self.sampling.config()
        twin_needed = batcher.head is not None and not (self.steering.neutral and spec.judge is None)
        slot = twin = None
        progress = _Progress()
        try:
            slot, twin, logits = batcher.join(self.ids, self.steering, twin=twin_needed)
            generator = None
            if cfg.mode == "sample":
                generator = torch.Generator().manual_seed(self.sampling.seed if self.sampling.seed is not None else 0)
            chooser = cfg.chooser(generator)
            switch = SteeringSwitch()
            judge = None
            if spec.judge is not None:
                settings = self.steering.how.settings()
                judge = spec.judge.judge(switch, lambda: progress.p_own, self.steering.neutral, **settings)
            off = Steering(self.steering.how, self.steering.how.neutral)

            def choose(logits: torch.Tensor) -> list[int]:
                tokens = chooser(logits)
                logprob = float(torch.log_softmax(logits[0], -1)[tokens[0]])
                del progress.logprob[progress.accepted :]
                progress.logprob.append(logprob)
                return tokens

            def forward(ids: torch.Tensor) -> torch.Tensor:
                if self._cancel.is_set():
                    raise GenerationCancelled()
                token = int(ids[0, 0])
                own = batcher.submit(slot, token, self.steering if switch.on else off)
                read = batcher.submit(twin, token, off) if twin is not None else None
                logits, progress.p_own = own.result()
                p_good = read.result()[1] if read is not None else progress.p_own
                del progress.p_good[progress.fed :]
                progress.p_good.append(p_good)
                progress.fed += 1
                return logits[None]

            def crop(n: int) -> None:
                batcher.crop(slot, n)
                if twin is not None:
                    batcher.crop(twin, n)
                progress.fed -= n

            stop = stop_tokens(tok)
            tokens: list[int] = []
            for step in decode(logits[None], cfg.max_new_tokens, stop, forward, choose, judge, crop):
                tokens = step[0]
                progress.accepted = len(tokens)
                if self._emit(tokens, progress, judge, final=False):
                    return  # a stop string ended it
            if tokens and tokens[-1] not in stop and progress.fed < len(tokens):
                forward(torch.tensor([[tokens[-1]]]))  # the last token's p(good): its forward
            ended = "stop" if tokens and tokens[-1] in stop else "length"
            self._emit(tokens, progress, judge, final=True, reason=ended)
        except GenerationCancelled:
            pass
        except Exception as e:  # the client hears what failed; the server goes on
            self._on_chunk(Chunk(finish_reason="error", error=f"{type(e).__name__}: {e}"))
        finally:
            for s in (slot, twin):
                if s is not None:
                    batcher.leave(s)
            self.engine._finished(self)

    def _emit(self, tokens: Sequence[int], progress: _Progress, judge, final: bool, reason: str | None = None) -> bool:
        """Hand the client the tokens whose p(good) is known; True when a stop string ended the text."""
        tok, stop = self.engine.tokenizer, stop_tokens(self.engine.tokenizer)
        known = [t for t in tokens[: min(len(tokens), progress.fed)] if t not in stop]
        text = tok.decode(known, skip_special_tokens=True).lstrip()
        if not final and text.endswith("\ufffd"):
            return False  # a character split across tokens: wait for the rest
        cut = min((i for i in (text.find(s) for s in self.sampling.stop) if i >= 0), default=-1)
        if cut >= 0:
            text, final, reason = text[:cut], True, "stop"
        elif not final and self.sampling.stop:
            text = text[: max(len(progress.text), len(text) - max(map(len, self.sampling.stop)) + 1)]
        n = progress.emitted  # the tokens the text holds (all of them at the end, unless a stop string cut it)
        if final and cut < 0:
            n = len(known)
        while n < len(known) and len(tok.decode(known[: n + 1], skip_special_tokens=True).lstrip()) <= len(text):
            n += 1
        new = range(progress.emitted, n)
        verdicts = tuple(
            TokenVerdict(tok.decode([known[i]]), known[i], progress.logprob[i], _p(progress.p_good[i])) for i in new
        )
        takes = [t for t in judge.taken_back[progress.taken_back :] if t.position < n] if judge is not None else []
        taken_back = tuple(
            TakenBack(
                t.position, tok.decode([t.original]), tok.decode([t.new]), t.new != t.original, t.p_good, t.p_good_after
            )
            for t in takes
        )
        delta = text[len(progress.text) :]
        progress.emitted, progress.text, progress.taken_back = n, text, progress.taken_back + len(takes)
        if delta or verdicts or taken_back or final:
            self._on_chunk(Chunk(delta, verdicts, taken_back, reason if final else None, len(known) if final else 0))
        return final and cut >= 0


def _p(value: float) -> float | None:
    return None if value != value else float(value)  # NaN: no head


class ServeEngine:
    """The generations of one steering session's merged model, batched (the module docstring)."""

    def __init__(self, session: SteeringSession, precision: Precision = "auto", slots: int = 16, waiting: int = 32):
        lm = session.lm
        try:
            head = session.head()
        except Exception:  # an adapter without a head: no p(good), no gated mode
            head = None
        self.session, self.tokenizer, self.has_head = session, lm.tokenizer, head is not None
        decode_precision = GenerationConfig.chosen(precision).decode_on(lm.model.device.type)
        self.batcher = Batcher(lm, session.vectors, session.lora, head, decode_precision, slots)
        self.waiting_limit = waiting
        self._lock = threading.Lock()
        self._live: set[Generation] = set()

    @classmethod
    def for_adapter(cls, adapter, precision: Precision = "auto", slots: int = 16, waiting: int = 32) -> "ServeEngine":
        """The engine of an adapter (a run, a PEFT folder, a hub id) merged, with the steering vectors the Steering page
        opens on (the first records of its data's validation split; cached in cache/analysis/, shipped for demos)."""
        adapter = open_adapter(adapter)
        settings = ProbeSettings(random_control=False, precision=resolve_precision(precision, adapter.device))
        records = labelled_split(adapter, "val", STEERING_TOKEN_RECORDS)
        vectors = build_steering_vectors(adapter, records, settings)
        return cls(SteeringSession.from_run(adapter, vectors), precision, slots, waiting)

    def start(
        self, ids: torch.Tensor, steering: Steering, sampling: Sampling, on_chunk: Callable[[Chunk], None]
    ) -> Generation:
        """A generation of the prompt `ids` (1 × positions), started (Busy when too many wait for a slot)."""
        with self._lock:
            if len(self._live) >= self.batcher.slots + self.waiting_limit:
                raise Busy()
            generation = Generation(self, ids, steering, sampling, on_chunk)
            self._live.add(generation)
        generation._thread.start()
        return generation

    def _finished(self, generation: Generation) -> None:
        with self._lock:
            self._live.discard(generation)

    @property
    def live(self) -> int:
        """Generations running or waiting for a slot."""
        return len(self._live)

    def close(self) -> None:
        for g in list(self._live):
            g.cancel()
        self.batcher.close()
