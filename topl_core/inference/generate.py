"""Merge a run's LoRA into its base model (the head is dropped: generation uses the original LM head) and
generate responses for one or many documents.

    generate(lm, documents, cfg) -> list[str]                 batched: cfg.batch_size documents as left-padded rows
    stream_documents(lm, documents, cfg) -> Iterator[list[list[int]]]   every row's new tokens so far, documents of
        different lengths as one batch through decode.decode (the one loop)
    stream_generate(lm, document, cfg, prefix=None) -> Iterator[str]
        one document: the text so far after every new token (greedy: its last value is generate's text; sampled:
        generate's draws); a page shows the words as they come and stops when the reader moves on (closing it)
    stream_rows(lm, document, rows, cfg, prefix=None, judge=None) -> Iterator[list[list[int]]]   every row's new
        tokens so far, rows of one prompt as a batch (a λ per row under steering), through decode.decode (the one
        loop), with the judge it is given (one row)
    prefill(lm, document, cfg) -> Prefill                     the prompt run once: its KV cache and last logits,
        which the streams decode from (a copy), so the prompt is not run again
    model_lock(model) -> RLock                                 the lock generation on one model object takes
    with cancel_on(model, event): ...                          any generation from this thread stops (raising
        GenerationCancelled) at its next decoder layer once `event` is set: work done ahead that nobody waits for
"""

from __future__ import annotations

import inspect
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import torch

from ..data.encode import build_prompt, truncate_document
from ..foundations.config_fields import config_field
from ..hardware.precision import (
    DECODE_PRECISION_HELP,
    PRECISION_HELP,
    PRECISIONS,
    Precision,
    ResolvedPrecision,
    autocast,
    resolve_decode_precision,
)
from ..models.architecture import decoder_layers
from ..models.forward import through_layer
from ..models.loading import LoadedModel, ModelSpec, load_model
from ..training.adapters import load_adapter
from .decode import Choose, Judge, decode, decoded_texts, final_texts, stop_tokens
from .kv_cache import with_room
from .prompt_layers import resumed_prompt

_MODEL_LOCKS: "weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_MODEL_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class GenerationConfig:
    """How a response is generated: its length, greedy or sampled, the document's cut, the batch and the precision.

    Example: ``session.generate_grid(document, [-2, 0, 2], GenerationConfig(max_new_tokens=48))``"""

    max_new_tokens: int = config_field(96, label="Max new tokens", help="the longest response, in tokens", min=1)
    mode: Literal["greedy", "sample"] = config_field(
        "greedy", label="Decoding", help="greedy: the likeliest token at each step; sample: drawn (temperature, top_p)"
    )
    temperature: float = config_field(
        0.7, label="Temperature", help="sampling temperature (sample decoding)", min=0.01, max=5.0
    )
    top_p: float = config_field(
        0.9, label="Top p", help="sample from the likeliest tokens holding this much probability", min=0.01, max=1.0
    )
    seed: int = config_field(0, label="Seed", help="seed of the sampling", min=0)
    max_doc_tokens: int | None = config_field(
        512, label="Max document tokens", help="the document is cut to this many tokens in the prompt", min=1
    )
    batch_size: int = config_field(4, label="Batch size", help="documents generated at once", min=1, max=256)
    # compute precision of the forward passes (bf16 = autocast); "auto" resolves for the model's device when it
    # generates: callers that key a cache by this config resolve it first (EvalConfig does)
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    # the one-token decode steps apart from the prompt: on a CPU, bf16 autocast casts every weight on every call,
    # which one token does not repay (hardware.precision.resolve_decode_precision)
    decode_precision: Precision = config_field("auto", label="Decode precision", help=DECODE_PRECISION_HELP)

    def __post_init__(self) -> None:
        for name in ("precision", "decode_precision"):
            if getattr(self, name) not in PRECISIONS:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: choose one of {PRECISIONS} ('auto' follows the hardware)."
                )
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be at least 1.")
        if self.mode not in ("greedy", "sample"):
            raise ValueError(f"mode={self.mode!r}: choose 'greedy' or 'sample'.")
        if self.mode == "sample" and not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature}: sampling needs a positive temperature.")

    @classmethod
    def chosen(cls, precision: str, **settings) -> GenerationConfig:
        """The config for a precision a person chose (a command's --precision, a page's picker): an explicit one
        serves both phases; "auto" lets the decode steps take their own faster precision."""
        return cls(precision=precision, decode_precision=precision, **settings)

    def decode_on(self, device: str) -> ResolvedPrecision:
        """The precision the decode steps run in on `device`."""
        return resolve_decode_precision(self.precision, self.decode_precision, device)

    def chooser(self, generator: torch.Generator | None = None) -> Choose:
        """Every row's next token from float32 logits (rows × vocabulary): the argmax, or a draw after transformers'
        own temperature and top-p warpers, as generate() samples — from `generator`, else torch's global generator
        (the same draws give generate()'s tokens: seed it first)."""
        if self.mode == "greedy":
            return lambda logits: logits.argmax(-1).tolist()
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        warpers = (TemperatureLogitsWarper(self.temperature), TopPLogitsWarper(self.top_p))

        def sample(logits: torch.Tensor) -> list[int]:
            scores = logits
            for warp in warpers:
                scores = warp(None, scores)
            probs = torch.softmax(scores, dim=-1)
            return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0].tolist()

        return sample


_SAMPLING_LOCK = threading.RLock()  # sampling seeds torch's global RNG: one sampled generation at a time


@contextmanager
def seeded(cfg: GenerationConfig) -> Iterator[None]:
    """For sampling, torch's global generator held (one sampled generation at a time) and seeded with cfg.seed;
    greedy: nothing."""
    if cfg.mode != "sample":
        yield
        return
    with _SAMPLING_LOCK:
        torch.manual_seed(cfg.seed)
        yield


def load_merged(spec: ModelSpec | str, adapter) -> LoadedModel:
    """A fresh base model with the adapter's LoRA merged in (or the plain base model when adapter is None);
    `adapter`: anything open_adapter opens.

    Example: ``merged = load_merged("smollm2-135m", "examples/adapters/topl-smollm2")``"""
    lm = load_model(spec)
    if adapter is not None:
        lm.model = load_adapter(lm, adapter, merge=True)
    return lm


def _prompt(lm: LoadedModel, document: str, cfg: GenerationConfig, task: str, lang_pair: str | None) -> str:
    return build_prompt(lm.tokenizer, truncate_document(lm.tokenizer, document, cfg.max_doc_tokens), task, lang_pair)


def prompt_length(
    lm: LoadedModel, document: str, cfg: GenerationConfig, task: str = "summarization", lang_pair: str | None = None
) -> int:
    """The number of positions prefill(lm, document, cfg, task) runs (tokenizing only)."""
    return len(lm.tokenizer(_prompt(lm, document, cfg, task, lang_pair), add_special_tokens=False).input_ids)


def generate(
    lm: LoadedModel,
    documents: Sequence[str],
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
) -> list[str]:
    """Generate one response per document (stops at end-of-turn), cfg.batch_size documents at a time as left-padded
    rows of the one decode loop (stream_documents; sampled: each batch seeded with cfg.seed + its first index). A
    translation's lang_pair ("en-de") names the languages in the prompt."""
    outputs: list[str] = []
    for i in range(0, len(documents), cfg.batch_size):
        if cfg.mode == "sample":
            torch.manual_seed(cfg.seed + i)
        outputs.extend(
            final_texts(lm.tokenizer, stream_documents(lm, documents[i : i + cfg.batch_size], cfg, task, lang_pair))
        )
    return outputs


@torch.inference_mode()
def stream_documents(
    lm: LoadedModel,
    documents: Sequence[str],
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
) -> Iterator[list[list[int]]]:
    """Several documents decoded as one batch by the one loop (decode.decode): their prompts left-padded to one
    length (each row's positions counted from its first real token, the padding masked, as transformers' generate
    pads), every row's new tokens so far after each step. One document: no padding, stream_rows' own tokens."""
    tok, model = lm.tokenizer, lm.model
    prompts = [_prompt(lm, d, cfg, task, lang_pair) for d in documents]
    old_side = tok.padding_side
    tok.padding_side = "left"
    try:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = old_side
    device = model.device
    mask = enc.attention_mask.to(device)
    from transformers import DynamicCache

    cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with autocast(cfg.precision, device.type):
        out = model(
            input_ids=enc.input_ids.to(device),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **_last_logits_only(model),
        )
    precision = cfg.decode_on(device.type)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        nonlocal mask
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        with autocast(precision, device.type):
            return (
                model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=mask.sum(-1, keepdim=True) - 1,
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )

    yield from decode(out.logits[:, -1].float(), cfg.max_new_tokens, stop_tokens(tok), forward, cfg.chooser())


def _last_logits_only(model: torch.nn.Module) -> dict:
    """The forward's argument that keeps the last position's logits only, as transformers' generate asks for them (the
    same rounding as its first token's): the whole prompt's (T × vocabulary) logits are a large part of a small
    model's prompt forward."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


@dataclass
class Prefill:
    """A prompt run through the model once: its KV cache (`length` positions) and its last position's logits (float32),
    from which the first new token is chosen. stream_generate decodes from a copy of the cache (kv_cache.with_room: a
    sliding-window layer's cache drops old positions as it grows, so it cannot be cropped back), so one Prefill serves
    any number of generations."""

    cache: object  # a transformers Cache
    logits: torch.Tensor
    length: int


@torch.no_grad()
def prefill(
    lm: LoadedModel,
    document: str,
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
) -> Prefill:
    """Run the prompt of `document` once (see Prefill); the forward is a plain causal-LM forward with an empty cache,
    so steering hooks restricted to generated positions leave it untouched."""
    cache, logits, length = _prompt_forward(lm, document, cfg, task, lang_pair, rows=1)
    return Prefill(cache, logits[0], length)


def _prompt_forward(
    lm: LoadedModel, document: str, cfg: GenerationConfig, task: str, lang_pair: str | None, rows: int
) -> tuple[object, torch.Tensor, int]:
    """The prompt of `document` in `rows` identical rows: (its KV cache, the last position's logits per row in
    float32, the prompt's length)."""
    tok = lm.tokenizer
    ids = tok(_prompt(lm, document, cfg, task, lang_pair), return_tensors="pt", add_special_tokens=False).input_ids
    cache, logits = prompt_forward(lm, ids.repeat(rows, 1), cfg.precision)
    return cache, logits, ids.shape[1]


def prompt_forward(
    lm: LoadedModel, ids: torch.Tensor, precision: Precision, every_position: bool = False, through: int | None = None
) -> tuple[object, torch.Tensor | None]:
    """The prompt `ids` (rows × positions, one length) run once in `precision`: (its KV cache, a DynamicCache; the
    last position's logits per row in float32 — with `every_position`, every position's: rows × positions ×
    vocabulary, as the forward computed them). `through`: the forward stops after that decoder layer (its cache
    holds the layers up to it; no logits: None)."""
    from transformers import DynamicCache

    model = lm.model
    cache = DynamicCache()
    keep = {} if every_position else _last_logits_only(model)

    def forward():
        with autocast(precision, model.device.type):
            return model(input_ids=ids.to(model.device), past_key_values=cache, use_cache=True, **keep)

    def first_row(layer: int) -> None:  # rows of one prompt: its layers below `layer` run once, for one row
        prompt_forward(lm, ids[:1], precision, through=layer - 1)

    # from the first steered layer, where a forward of this prompt kept the layers below it
    with resumed_prompt(model, ids, precision, cache, through, first_row) as forward_done:
        out = through_layer(model, through, forward)
        forward_done()
    if out is None:
        return cache, None
    return cache, (out.logits if every_position else out.logits[:, -1].float())


def stream_generate(
    lm: LoadedModel,
    document: str,
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
    prefix: Prefill | None = None,
) -> Iterator[str]:
    """Generation for one document, yielding the response so far (stripped, special tokens dropped) after each new
    token; greedy, the last value is generate(lm, [document], cfg)[0] token for token (tested); sampled, it draws from
    torch's global generator as generate() does (seed it first: generate() seeds it with cfg.seed). `prefix`: the
    prompt's Prefill to decode from instead of running the prompt (it must come from the same model, document, cfg
    and task). Autocast is entered per forward (the prompt's in cfg.precision, each new token's in cfg.decode_on),
    never across a yield; closing the iterator stops the generation."""
    steps = stream_rows(lm, document, 1, cfg, task, lang_pair, prefix)
    for texts in decoded_texts(lm.tokenizer, steps):
        yield texts[0]


@torch.inference_mode()  # no autograd bookkeeping on any tensor (its cost: docs/performance.md, inference_mode)
def stream_rows(
    lm: LoadedModel,
    document: str,
    rows: int,
    cfg: GenerationConfig = GenerationConfig(),
    task: str = "summarization",
    lang_pair: str | None = None,
    prefix: Prefill | None = None,
    judge: Judge | None = None,
) -> Iterator[list[list[int]]]:
    """`rows` rows of the same prompt decoded as one batch (a λ grid steered with a λ per row) by the one loop
    (decode.decode): every row's new tokens so far after each step, a finished row kept as it ended; the stream ends
    when every row has. Row r is what a stream of row r's steering alone gives, up to the last float bits a batch's
    matmul shapes can move (as generate_grid). `judge`: the loop's judge (one row), which may take tokens back (the
    cache is cropped)."""
    tok, model = lm.tokenizer, lm.model
    if prefix is None:
        cache, logits, _ = _prompt_forward(lm, document, cfg, task, lang_pair, rows)
        cache = with_room(cache, cfg.max_new_tokens)
    else:
        cache, logits = with_room(prefix.cache, cfg.max_new_tokens, rows), prefix.logits.expand(rows, -1)
    precision = cfg.decode_on(model.device.type)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        with autocast(precision, model.device.type):
            return model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1].float()

    yield from decode(
        logits, cfg.max_new_tokens, stop_tokens(tok), forward, cfg.chooser(), judge, lambda n: cache.crop(-n)
    )


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The lock that guards generation on one model object (every steering session on it, the cancel hooks' owner)."""
    with _MODEL_LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


class GenerationCancelled(Exception):
    """A generation stopped by cancel_on's event."""


@contextmanager
def cancel_on(model: torch.nn.Module, event: threading.Event) -> Iterator[None]:
    """While active, every decoder layer of `model` called from this thread raises GenerationCancelled once `event`
    is set, so any generation loop (transformers' generate, stream_generate, a gated decoder) stops within one layer's
    time (a prompt forward's tenths of a second on a 2-core CPU, one layer of it). Other threads' forwards are
    untouched. Register it where no other thread runs the model (SteeringSession holds the model's lock)."""
    owner = threading.get_ident()

    def check(_module, _args) -> None:
        if event.is_set() and threading.get_ident() == owner:
            raise GenerationCancelled()

    handles = [layer.register_forward_pre_hook(check) for layer in decoder_layers(model)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
