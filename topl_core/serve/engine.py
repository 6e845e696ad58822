"""The service's engine: each requested completion is a Generation — a thread running the one decode loop
(inference/decode.decode, with the mode's judge where it has one) whose forwards the Batcher batches with every other
generation's — and what a client reads of it: text as it comes, each token with its log-probability and the adapter's
p(good), what a judge replaced, why it ended.

    engine = ServeEngine(session, precision="fp32", slots=16, waiting=32)
    generations = engine.start([Request(prompt_ids, Steering(how, λ), Sampling(...), on_chunk), ...])   all of a
        client's generations or none (Busy when they would not all fit the queue); on_chunk(Chunk) is called from
        the generation's thread after every new piece of text
    generation.cancel()                    a client that went away: its generation stops at its next step, or, still
        waiting for a slot, leaves the queue
    engine.idle()                          every slot free, no generation alive (whenever nothing runs)

p(good) is read where the Token overlay reads it: the adapter's head on the merged model's (unsteered) hidden states
of the prompt and the text so far. A steered generation's forwards are steered, so it decodes with a twin slot in the
batch that reads the same tokens unsteered (the Batcher's `twin`); an unsteered one reads its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..foundations.presets import FLAG_THRESHOLD
from ..hardware.precision import Precision, resolve_phases
from ..hardware.threads import one_core_for_this_thread
from ..inference.decode import decode, stop_tokens
from ..inference.generate import GenerationCancelled, GenerationConfig
from ..runtime.hooks import SteeringSwitch
from ..runtime.session import SteeringSession
from .batch import PROMPT_CACHE_MB, Batcher
from .echo import PromptScores
from .row_steering import Steering


class Busy(Exception):
    """Every slot is taken and the queue of waiting generations is full (the client should retry later)."""


@dataclass(frozen=True)
class Sampling:
    """How a completion is decoded: greedy or sampled (temperature, top_p, seed: None draws afresh, as OpenAI does),
    its length and stop strings; and what its tokens carry: `top_logprobs` alternatives each, and with `echo` the
    prompt's own tokens scored as well (max_tokens 0: only those)."""

    max_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    echo: bool = False

    def config(self) -> GenerationConfig:
        if self.temperature == 0:
            return GenerationConfig(max_new_tokens=self.max_tokens)
        top_p = min(max(self.top_p, 0.01), 1.0)
        return GenerationConfig(
            max_new_tokens=self.max_tokens, mode="sample", temperature=self.temperature, top_p=top_p
        )


@dataclass(frozen=True)
class TokenVerdict:
    """One token: its text, id, log-probability under the generating (steered) model (None: a prompt's first token,
    which nothing precedes), its `top` alternatives as (text, log-probability), the adapter's p(good) of it (None
    without a head), and whether it is the prompt's (an echo) rather than generated."""

    token: str
    token_id: int
    logprob: float | None
    p_good: float | None
    top: tuple[tuple[str, float], ...] = ()
    prompt: bool = False


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
    why it ended ("stop": a stop token or string; "length": max_tokens) with the token counts. An echo's first chunk
    carries the prompt's own tokens (`prompt`)."""

    text: str = ""
    tokens: tuple[TokenVerdict, ...] = ()
    taken_back: tuple[TakenBack, ...] = ()
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: str | None = None
    prompt: tuple[TokenVerdict, ...] = ()


@dataclass
class _Progress:
    """A generation's running state: per generated position, the log-probability and p(good) (index = position)."""

    logprob: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    p_good: list[float] = field(default_factory=list)
    fed: int = 0  # positions run through the model (a judge's take-back moves it back)
    accepted: int = 0  # tokens yielded by the loop so far
    p_own: float = float("nan")  # the head's reading of the last forward's own (steered) row: what a judge reads
    emitted: int = 0  # tokens handed to the client
    text: str = ""  # the text handed to the client
    taken_back: int = 0  # take-backs handed to the client


@dataclass(frozen=True)
class Request:
    """One completion asked for: the prompt's token ids (1 × positions), its steering and sampling, and where its
    chunks go."""

    ids: torch.Tensor
    steering: Steering
    sampling: Sampling
    on_chunk: Callable[[Chunk], None]


class Generation:
    """One completion (the module docstring)."""

    def __init__(self, engine: "ServeEngine", request: Request):
        self.engine, self.ids, self.steering, self.sampling = engine, request.ids, request.steering, request.sampling
        self._on_chunk = request.on_chunk
        self._cancel = threading.Event()
        self._joining = None  # the batcher's join while it waits for a slot
        self.prompt_tokens = self.ids.shape[1]
        self.threshold = float(self.steering.how.tau) if self.steering.how.spec.judge is not None else FLAG_THRESHOLD
        self._thread = threading.Thread(target=self._run, name="topl-serve-generation", daemon=True)

    def cancel(self) -> None:
        self._cancel.set()
        joining = self._joining
        if joining is not None:
            joining.cancel()  # still waiting for a slot: it leaves the queue (running or done: no effect)

    def _run(self) -> None:
        one_core_for_this_thread()  # the batcher's thread alone runs parallel work: one team (hardware/threads.py)
        batcher, tok = self.engine.batcher, self.engine.tokenizer
        slot = twin = None
        progress = _Progress()
        outcome = "cancelled"
        try:  # everything: whatever fails, the client hears of it and the slots go back (the finally)
            spec = self.steering.how.spec
            twin_needed = batcher.head is not None and not (self.steering.neutral and spec.judge is None)
            if self._cancel.is_set():
                raise GenerationCancelled()
            score = self.sampling.top_logprobs if self.sampling.echo else None
            self._joining = batcher.join(self.ids, self.steering, twin=twin_needed, score=score)
            if self._cancel.is_set():
                self._joining.cancel()
            joined = self._joining.result()
            slot, twin, logits = joined.slot, joined.twin, joined.logits
            if joined.prompt is not None:
                self._on_chunk(Chunk(prompt=self._echo(joined.prompt)))
            if self.sampling.max_tokens == 0:
                self._on_chunk(Chunk(finish_reason="length"))
                outcome = "length"
                return
            cfg = self.sampling.config()
            generator = None
            if cfg.mode == "sample":
                generator = torch.Generator()
                if self.sampling.seed is None:
                    generator.seed()  # fresh randomness from the OS, as OpenAI samples without a seed
                else:
                    generator.manual_seed(self.sampling.seed)
            chooser = cfg.chooser(generator)
            switch = SteeringSwitch()
            judge = None
            if spec.judge is not None:
                settings = self.steering.how.settings()
                judge = spec.judge.judge(switch, lambda: progress.p_own, self.steering.neutral, **settings)
            off = Steering(self.steering.how, self.steering.how.neutral)

            def choose(logits: torch.Tensor) -> list[int]:
                tokens = chooser(logits)
                lsm = torch.log_softmax(logits[0], -1)
                del progress.logprob[progress.accepted :], progress.top[progress.accepted :]
                progress.logprob.append(float(lsm[tokens[0]]))
                top = lsm.topk(self.sampling.top_logprobs) if self.sampling.top_logprobs else None
                progress.top.append(tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ())
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
                    outcome = "stop"
                    return  # a stop string ended it
            if tokens and tokens[-1] not in stop and progress.fed < len(tokens):
                forward(torch.tensor([[tokens[-1]]]))  # the last token's p(good): its forward
            outcome = "stop" if tokens and tokens[-1] in stop else "length"
            self._emit(tokens, progress, judge, final=True, reason=outcome)
        except (GenerationCancelled, CancelledError):
            outcome = "cancelled"
        except Exception as e:  # the client hears what failed; the server goes on
            outcome = "error"
            self._on_chunk(Chunk(finish_reason="error", error=f"{type(e).__name__}: {e}"))
        finally:
            for s in (slot, twin):
                if s is not None:
                    batcher.leave(s)
            self.engine._finished(self, outcome)

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
            TokenVerdict(
                tok.decode([known[i]]),
                known[i],
                progress.logprob[i],
                _p(progress.p_good[i]),
                self._top(progress.top[i]),
            )
            for i in new
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

    def _top(self, top: Sequence[tuple[int, float]]) -> tuple[tuple[str, float], ...]:
        return tuple((self.engine.tokenizer.decode([i]), lp) for i, lp in top)

    def _echo(self, scores: PromptScores) -> tuple[TokenVerdict, ...]:
        """The prompt's own tokens as verdicts: the first has no log-probability (nothing precedes it)."""
        ids = self.ids[0].tolist()
        logprobs = [None, *scores.logprob]
        tops = [(), *scores.top]
        decode = self.engine.tokenizer.decode
        return tuple(
            TokenVerdict(decode([t]), t, lp, _p(p), self._top(top), prompt=True)
            for t, lp, p, top in zip(ids, logprobs, scores.p_good, tops)
        )


def _p(value: float) -> float | None:
    return None if value != value else float(value)  # NaN: no head


class ServeEngine:
    """The generations of one steering session's merged model, batched (the module docstring)."""

    def __init__(
        self,
        session: SteeringSession,
        precision: Precision = "auto",
        slots: int = 16,
        waiting: int = 32,
        prompt_cache_mb: int = PROMPT_CACHE_MB,
    ):
        lm = session.lm
        try:
            head = session.head()
        except Exception:  # an adapter without a head: no p(good), no gated mode
            head = None
        if slots < 1 + (head is not None) or waiting < 0:
            raise ValueError(
                f"slots={slots}, waiting={waiting}: an adapter with a head decodes a steered request in two slots (its "
                "own and the unsteered twin where p(good) is read), so give 2 slots or more (1 without a head), and "
                "0 or more waiting."
            )
        self.session, self.tokenizer, self.has_head = session, lm.tokenizer, head is not None
        precisions = resolve_phases(precision, precision, lm.model.device.type)  # the page's: prompt, steps
        self.batcher = Batcher(lm, session.vectors, session.lora, head, precisions, slots, prompt_cache_mb)
        self.waiting_limit = waiting
        text_config = lm.model.config.get_text_config()
        self.context_window: int | None = getattr(text_config, "max_position_embeddings", None)
        self.vocabulary = len(lm.tokenizer)
        self._lock = threading.Lock()
        self._live: set[Generation] = set()
        self._threads: list[threading.Thread] = []  # the generations' threads, until idle() sees them ended
        self.ended: Counter[str] = Counter()  # how the generations ended: stop, length, cancelled, error

    @property
    def capacity(self) -> int:
        """The most generations alive at once: decoding in a slot or waiting for one."""
        return self.batcher.slots + self.waiting_limit

    def start(self, requests: Sequence[Request]) -> list[Generation]:
        """The generations of one client's requests, started: all of them, or none when they would not all fit
        (Busy: the client should retry later)."""
        with self._lock:
            if len(self._live) + len(requests) > self.capacity:
                raise Busy()
            generations = [Generation(self, r) for r in requests]
            self._live.update(generations)
            self._threads += [g._thread for g in generations]
        for k, generation in enumerate(generations):
            try:
                generation._thread.start()
            except BaseException:  # no thread to be had: none of this client's generations runs
                for g in generations[k:]:
                    self._finished(g, "cancelled")
                for g in generations[:k]:
                    g.cancel()
                raise
        return generations

    def _finished(self, generation: Generation, outcome: str) -> None:
        with self._lock:
            self._live.discard(generation)
            self.ended[outcome] += 1

    @property
    def live(self) -> int:
        """Generations running or waiting for a slot."""
        return len(self._live)

    def idle(self) -> bool:
        """The invariant at rest: no generation alive (nor its thread), every slot free, nothing queued."""
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            alive = bool(self._live or self._threads)
        return not alive and self.batcher.idle()

    def health(self) -> dict:
        """What /health answers: generations alive, the forwards run by kind, the compiled step's lengths (ready,
        building, failed; none where it does not apply)."""
        compiled = self.batcher.compiled
        return {
            "status": "ok",
            "live": self.live,
            "forwards": dict(self.batcher.forwards),
            "compiled_steps": None if compiled is None else compiled.state(),
        }

    def close(self) -> None:
        for g in list(self._live):
            g.cancel()
        self.batcher.close()
