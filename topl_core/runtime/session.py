"""A merged model kept for steering by a UI, a study or the service (each method's docstring says what it does).

SteeringSession(lm, vectors, head=None)     lm: a LoadedModel holding the MERGED model (load_merged(spec, run))
    texts:    generate_steered, generations (batched documents), generate_grid / grid_generations (a λ grid as one
              batch); streamed: stream_steered, stream_generations, stream_grid (cancellable: `cancel`)
    compiled: compile_decode(wait=True), warm_decode, decode_ready, compiles_decode, decoder — a compiled decode step
              (inference/exported_decode.py on a CPU, compiled_decode.py on a GPU) for modes that add constant vectors
    from_run(run, vectors, spec=None, head=None); head(): the adapter's token-level head (the gated mode's judge)

How one steered token is made: inside modes.steer() (the mode's action's edits hooked on the merged model), the prompt's
forward (steered, or the session's cached unsteered Prefill), then the one decode loop (inference/decode.py) — eager
through inference.stream_rows, a λ per batch row, or through the compiled step — with the mode's judge where it has one
(gate.HeadGate: it takes flagged tokens back); a λ grid is a batch of rows of it, and so are documents of different
lengths (left-padded rows: inference.stream_documents). Generation holds
a per-model lock (sessions sharing one model take turns; sessions on different models run in parallel) and stops the
exported steps' builds meanwhile (foundations/idle_children.busy); it never mutates the model, the tokenizer or the
vectors.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager, nullcontext
from typing import Iterator, Sequence

import torch

from ..foundations.errors import ModelError
from ..foundations.idle_children import busy
from ..inference.compiled_decode import CompiledDecoder, DecoderBusy, StepDecoder, StepKey
from ..inference.decode import decoded_texts, final_texts
from ..inference.exported_decode import ExportedDecoder
from ..inference.generate import (
    GenerationCancelled,
    GenerationConfig,
    Prefill,
    cancel_on,
    generate,
    load_merged,
    model_lock,
    prefill,
    prompt_length,
    seeded,
    stream_rows,
)
from ..inference.prompt_cache import PromptCache
from ..models.loading import LoadedModel, ModelSpec
from ..training.adapters import open_adapter
from .gate import Head
from .hooks import SteeringSwitch
from .modes import SteerConfig, steer
from .sites import LoraWeights, Site, residual_paths, site_module
from .steered_text import SteeredText
from .vectors import SteeringVectors

# the least number of λ positions generate_grid puts in one generate call: the default grids (17 slider positions)
# fit in one; the KV cache grows with rows × (prompt + new tokens) (docs/performance.md, "Figures behind the code's
# choices", has its size on an 8B model)
GRID_ROWS = 32
PREFILLS_KEPT = 4  # prompts whose KV cache a session keeps (their size: docs/performance.md, as above)


class SteeringSession:
    """A merged model + steering vectors, kept by a UI or a notebook. See the module docstring.

    Example: ``SteeringSession.from_run(adapter, vectors).generate_grid(document, [-2.0, 0.0, 2.0])``"""

    def __init__(self, lm: LoadedModel, vectors: SteeringVectors, check_base: bool = True, head: Head | None = None):
        if check_base and vectors.base_fingerprint and vectors.base_fingerprint != lm.fingerprint:
            raise ModelError(
                f"Steering vectors were computed on base model {vectors.base_model!r} (fingerprint "
                f"{vectors.base_fingerprint}) but the session's model is {lm.spec.name!r} ({lm.fingerprint}); load the "
                "adapter's own base model (SteeringSession.from_run)."
            )
        for s in vectors.sites:
            site_module(lm.model, s)  # fail now, not mid-generation, when a site is missing
        self.lm, self.vectors = lm, vectors
        self._lock = model_lock(lm.model)
        self._lora: dict[Site, LoraWeights] | None = None  # read on the first generation that scales the update
        self._head = None if head is None else Head(head.layer, head.linear.to(lm.model.device))
        self._prefills: PromptCache[Prefill] = PromptCache(max_entries=PREFILLS_KEPT)  # unsteered prompts
        self._compiled: StepDecoder | None = None  # compile_decode()
        self._compile_wait = True

    def lora(self) -> dict[Site, LoraWeights]:
        """The adapter's LoRA pairs (what an action that needs the LoRA reads), read once from vectors.adapter_path."""
        if self._lora is None:
            self._lora = self.vectors.adapter_lora()
        return self._lora

    def head(self) -> Head:
        """The adapter's token-level head (what a gated mode reads): the one given, else the run's own, read once."""
        if self._head is None:
            adapter = open_adapter(self.vectors.adapter_path) if self.vectors.adapter_path else None
            if adapter is None or not adapter.has_head:
                name = adapter.name if adapter is not None else "these steering vectors' adapter (none named)"
                raise ModelError(
                    f"{name} has no token-level head, and a gated mode steers where the head flags a token. Fit a "
                    "probe head on its hidden states (score-tokens --probe-head, or a deck with head: probe) and "
                    "give it: SteeringSession(lm, vectors, head=Head(layer, linear))."
                )
            self._head = Head(int(adapter.head_layer), adapter.run.load_head(self.lm.model.device))
        return self._head

    def compile_decode(self, wait: bool = True, decoder: type[StepDecoder] | None = None) -> None:
        """Stream with a compiled decode step from now on where it applies (the module docstring). `wait`: a stream
        whose length has no step yet builds it first; else it decodes eagerly until warm_decode has built it.
        `decoder`: how steps are built; by default on a CPU an AOTInductor package built by a child process
        (inference/exported_decode.py: the interpreter stays free for the eager streams meanwhile), on a GPU
        torch.compile with CUDA graphs (inference/compiled_decode.py)."""
        if decoder is None:
            decoder = ExportedDecoder if self.lm.model.device.type == "cpu" else CompiledDecoder
        with self._lock:
            if type(self._compiled) is not decoder:
                every = decoder.shifts_every_site
                paths = residual_paths(self.lm.model) if every else [s.path for s in self.vectors.sites]
                self._compiled = decoder(self.lm, paths)
            self._compile_wait = wait

    @property
    def decoder(self) -> StepDecoder | None:
        """The compiled decode step's decoder (compile_decode), or None."""
        return self._compiled

    def warm_decode(
        self, document: str, gen_cfg: GenerationConfig, how: SteerConfig = SteerConfig(), task: str = "summarization"
    ) -> bool:
        """Build the compiled step for the streams of `document` now (after compile_decode; on a CPU a child process
        builds it in about a minute for SmolLM2 on 2 cores (docs/performance.md), or an earlier build's package is
        loaded), without the model's lock: its streams go on eagerly meanwhile. False where such a stream decodes
        eagerly."""
        if not self.compiles_decode(gen_cfg, how):
            return False
        self._compiled.warm(self._step_key(document, gen_cfg, task))
        return True

    def decode_ready(
        self, document: str, gen_cfg: GenerationConfig, how: SteerConfig = SteerConfig(), task: str = "summarization"
    ) -> bool:
        """Whether the streams of `document` decode with the compiled step now (it is built)."""
        return self.compiles_decode(gen_cfg, how) and self._step_built(document, gen_cfg, task)

    def _step_built(self, document: str, gen_cfg: GenerationConfig, task: str) -> bool:
        """Whether a compiled stream of `document` starts at once (or, with compile_decode's wait, builds its step)."""
        return self._compile_wait or self._compiled.ready(self._step_key(document, gen_cfg, task))

    def _step_key(self, document: str, gen_cfg: GenerationConfig, task: str) -> StepKey:
        """The compiled step the streams of `document` decode in (after compile_decode)."""
        return self._compiled.key(prompt_length(self.lm, document, gen_cfg, task), gen_cfg)

    @classmethod
    def from_run(cls, adapter, vectors: SteeringVectors, spec=None, head: Head | None = None) -> "SteeringSession":
        """Load a fresh base model with the adapter's LoRA merged in (load_merged) and wrap it. `spec`: a ModelSpec,
        or a model name (default: the adapter's base model) loaded on the device the adapter was trained on, as its
        steering vectors are (a bare name used to load on the CPU: on a GPU machine, bench --slider / --gated /
        --serve, serve and steer decoded a GPU run on the CPU)."""
        adapter = open_adapter(adapter)
        if vectors.adapter_fingerprint and vectors.adapter_fingerprint != adapter.fingerprint():
            raise ModelError(
                f"Steering vectors belong to adapter {vectors.adapter_fingerprint} ({vectors.adapter_path}), not to "
                f"{adapter.path} ({adapter.fingerprint()}); recompute them for this adapter (python -m topl_core "
                f"steer --run {adapter.path})."
            )
        if not isinstance(spec, ModelSpec):
            spec = ModelSpec(spec or adapter.base_model, device=adapter.device)
        return cls(load_merged(spec, adapter), vectors, head=head)

    def generate_steered(
        self,
        document: str,
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> str:
        """One response for `document` steered with λ in mode `how` (λ = how.neutral: the merged model's output): the
        text stream_steered writes, through the one decode loop (grid_generations with one λ)."""
        return self.grid_generations(document, [lam], gen_cfg, task, how)[0].text

    def generations(
        self,
        documents: Sequence[str],
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> list[SteeredText]:
        """One generation per document at one λ (in a gated mode, with what the head took back and the counts): one
        document as generate_steered writes it, several in left-padded batches of gen_cfg.batch_size through the one
        decode loop (inference.generate; greedy batched outputs can differ from one-at-a-time outputs in the last float
        bits, as padding changes the matmul shapes: compare λ values within one mode)."""
        if len(documents) == 1:
            return self.grid_generations(documents[0], [lam], gen_cfg, task, how)
        return self._generate(documents, lam, gen_cfg, task, how)

    def generate_grid(
        self,
        document: str,
        lambdas: Sequence[float],
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> list[str]:
        """One response for `document` per λ of `lambdas`, in their order: the λ grid generated as one batch through
        the one decode loop (stream_grid's last step). Greedy: one prompt (where the mode steers it, once per λ row)
        and each row steered with its own λ (modes.steer), so a grid costs about one generation instead of
        len(lambdas) on a GPU; each text is the one generate_steered(document, λ) and the page's stream give (tested
        token for token in fp32; in bf16 the batch's matmul shapes can move the last bits and so flip a near-tie). One
        batch holds max(gen_cfg.batch_size, GRID_ROWS) λ positions: batch_size is sized for documents of different
        lengths, a grid's rows share one prompt. Sampling goes one λ at a time, each seeded with gen_cfg.seed as
        stream_steered is: a batch's rows would draw from one shared random stream, so no row would be the sample its
        λ gives alone."""
        return [g.text for g in self.grid_generations(document, lambdas, gen_cfg, task, how)]

    def grid_generations(
        self,
        document: str,
        lambdas: Sequence[float],
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> list[SteeredText]:
        """generate_grid's generations as SteeredText (in a gated mode: what the head took back and the counts). A
        mode that does not batch rows (gated) goes one λ at a time."""
        lambdas = [float(lam) for lam in lambdas]
        if gen_cfg.mode == "sample" or not how.spec.batches_rows:
            return [deque(self.stream_generations(document, lam, gen_cfg, task, how), maxlen=1)[0] for lam in lambdas]
        rows = max(gen_cfg.batch_size, GRID_ROWS)
        out: list[SteeredText] = []
        for start in range(0, len(lambdas), rows):
            chunk = lambdas[start : start + rows]
            with self._steering(chunk, how):
                texts = final_texts(self.lm.tokenizer, self._grid_rows(document, len(chunk), gen_cfg, task, how))
            out.extend(SteeredText(t) for t in texts)
        return out

    def stream_steered(
        self,
        document: str,
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
    ) -> Iterator[str]:
        """generate_steered's text as it is written: the response so far after every new token (sampled: seeded with
        gen_cfg.seed, as generate_steered draws). Where the prompt is not steered (how.steers_prompt False) its forward
        is the same for every λ, so it runs once per document and each λ decodes from its KV cache. The model's lock is
        held until the iterator ends or is closed: close it (or let it run out) before generating again."""
        for g in self.stream_generations(document, lam, gen_cfg, task, how):
            yield g.text

    def stream_generations(
        self,
        document: str,
        lam: float,
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator[SteeredText]:
        """stream_steered's texts as SteeredText (in a gated mode, with the replacements so far); once `cancel` is set,
        the stream stops at its next decoder layer with GenerationCancelled."""
        shifts = self._compiled_shifts(lam, gen_cfg, how)
        if shifts is not None and not self._step_built(document, gen_cfg, task):
            shifts = None  # its step is not built yet: decode eagerly rather than wait
        with self._lock, seeded(gen_cfg), self._stoppable(cancel):
            if shifts is not None:  # builds not paused: with compile_decode's wait, this stream builds its own step
                try:
                    yield from self._stream_compiled(document, lam, gen_cfg, task, how, shifts, cancel)
                    return
                except DecoderBusy:  # before its first text: warm_decode is loading another length's step
                    pass
            with self._steering(lam, how) as switch:
                yield from self._stream_eager(document, lam, gen_cfg, task, how, switch)

    def _stream_eager(
        self, document: str, lam: float, gen_cfg: GenerationConfig, task: str, how: SteerConfig, switch: SteeringSwitch
    ) -> Iterator[SteeredText]:
        """One stream through the one decode loop, inside steer() (its `switch`), with the mode's judge if any."""
        judge = how.spec.judge
        if judge is None:
            prefix = None if how.steers_prompt else self._prefill(document, gen_cfg, task)
            steps = stream_rows(self.lm, document, 1, gen_cfg, task, prefix=prefix)
            for texts in decoded_texts(self.lm.tokenizer, steps):
                yield SteeredText(texts[0])
            return
        neutral = float(lam) == how.neutral
        with judge.judging(self.lm.model, self.head(), switch, neutral, **how.settings()) as judged:
            prefix = self._prefill(document, gen_cfg, task)  # the judge turned the steering off: never the prompt
            for tokens in stream_rows(self.lm, document, 1, gen_cfg, task, prefix=prefix, judge=judged):
                yield judged.snapshot(self.lm.tokenizer, tokens[0])

    def compiles_decode(self, gen_cfg: GenerationConfig, how: SteerConfig = SteerConfig()) -> bool:
        """Whether a stream under `gen_cfg` in mode `how` decodes with the compiled step (after compile_decode())."""
        return self._compiled_shifts(how.neutral, gen_cfg, how) is not None

    def _compiled_shifts(self, lam: float, gen_cfg: GenerationConfig, how: SteerConfig) -> dict | None:
        """What the compiled step adds at each site for this stream; None where it decodes eagerly."""
        if self._compiled is None or how.spec.judge is not None or not self._compiled.supports(gen_cfg):
            return None  # a judge reads each token's forward: the eager loop
        return how.spec.action.decode_shifts(self.vectors, how.spec, how.units, lam)

    def _stream_compiled(self, document, lam, gen_cfg, task, how, shifts, cancel) -> Iterator[SteeredText]:
        """stream_generations on the compiled decoder (the session's lock held): the prompt steered eagerly where the
        mode steers it (else the cached unsteered one), every decode step shifted by the action's vectors."""
        if how.steers_prompt:
            with steer(self.lm.model, self.vectors, lam, how):
                prefix = prefill(self.lm, document, gen_cfg, task)
        else:
            prefix = self._prefill(document, gen_cfg, task)
        paths = {s.path: shift for s, shift in shifts.items()}
        for text in self._compiled.stream(prefix, gen_cfg, paths, wait=self._compile_wait):
            if cancel is not None and cancel.is_set():  # the compiled module tree has no cancel hooks
                raise GenerationCancelled()
            yield SteeredText(text)

    def stream_grid(
        self,
        document: str,
        lambdas: Sequence[float],
        gen_cfg: GenerationConfig = GenerationConfig(),
        task: str = "summarization",
        how: SteerConfig = SteerConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator[list[SteeredText]]:
        """grid_generations as it is written (greedy; a few λ: one batch holds them all): after every step, every λ's
        generation so far. A mode that batches rows decodes the λ as one batch, a λ per row (inference.stream_rows;
        where the prompt is not steered, from its cached KV cache); a mode that does not, or sampling, goes one λ after
        another (the λ not begun are empty). Once `cancel` is set, it stops at its next decoder layer
        (GenerationCancelled). The model's lock is held until the iterator ends or is closed."""
        lambdas = [float(lam) for lam in lambdas]
        if gen_cfg.mode == "sample" or not how.spec.batches_rows:  # one λ after another (as grid_generations)
            done: list[SteeredText] = []
            for lam in lambdas:
                for g in self.stream_generations(document, lam, gen_cfg, task, how, cancel):
                    yield [*done, g] + [SteeredText("")] * (len(lambdas) - len(done) - 1)
                done.append(g)
            return
        with self._steering(lambdas, how, cancel):
            steps = self._grid_rows(document, len(lambdas), gen_cfg, task, how)
            for texts in decoded_texts(self.lm.tokenizer, steps):
                yield [SteeredText(t) for t in texts]

    def _grid_rows(
        self, document: str, rows: int, gen_cfg: GenerationConfig, task: str, how: SteerConfig
    ) -> Iterator[list[list[int]]]:
        """Inside steer() at a λ per row: the one decode loop's steps over `rows` rows of `document`'s prompt (run
        steered, or the session's cached unsteered one)."""
        prefix = None if how.steers_prompt else self._prefill(document, gen_cfg, task)
        return stream_rows(self.lm, document, rows, gen_cfg, task, prefix=prefix)

    @contextmanager
    def _steering(
        self, lam: float | Sequence[float], how: SteerConfig, cancel: threading.Event | None = None
    ) -> Iterator[SteeringSwitch]:
        """The model's lock, the builds stopped (busy), the mode's hooks at λ (with the adapter's LoRA where its action
        reads it) and `cancel` heard: what every eager generation runs inside."""
        lora = self.lora() if how.spec.action.needs_lora else None
        with self._lock, busy(), steer(self.lm.model, self.vectors, lam, how, lora) as switch, self._stoppable(cancel):
            yield switch

    def _stoppable(self, cancel: threading.Event | None):
        """cancel_on(the model, cancel), or nothing to stop on."""
        return nullcontext() if cancel is None else cancel_on(self.lm.model, cancel)

    def _prefill(self, document: str, gen_cfg: GenerationConfig, task: str) -> Prefill:
        """The unsteered prompt of `document`, kept for the PREFILLS_KEPT most recent documents."""
        key = (document, task, gen_cfg.max_doc_tokens, gen_cfg.precision)
        kept = self._prefills.get(key)
        if kept is None:
            kept = prefill(self.lm, document, gen_cfg, task)
            self._prefills.put(key, kept)
        return kept

    def _generate(
        self,
        documents: Sequence[str],
        lam: float | Sequence[float],
        gen_cfg: GenerationConfig,
        task: str,
        how: SteerConfig,
        cancel: threading.Event | None = None,
    ) -> list[SteeredText]:
        """Inside steer(): a mode without a judge generates the documents as left-padded batches of the one decode
        loop (inference.generate); one with a judge streams each document through the one loop (seeded with
        gen_cfg.seed + its index, as generate seeds its batches). `lam`: one λ, or one per document when they form
        one batch."""
        with self._steering(lam, how, cancel) as switch, seeded(gen_cfg):
            if how.spec.judge is None:
                return [SteeredText(t) for t in generate(self.lm, documents, gen_cfg, task)]
            out = []
            for i, document in enumerate(documents):
                if gen_cfg.mode == "sample":
                    torch.manual_seed(gen_cfg.seed + i)
                *_, last = self._stream_eager(document, lam, gen_cfg, task, how, switch)
                out.append(last)
            return out
