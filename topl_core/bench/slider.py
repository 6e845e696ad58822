"""`bench --slider`: a new λ position of the Steering page's slider against the naive path, measured in one run.

For a document already shown (its prompt run once), each new λ is generated
- naive: the merged model under steer(λ) with plain generate() — the full prompt again, every forward in the one
  precision `auto` resolves to, nothing shown until the whole summary is done (what the page did before streaming);
- slider: SteeringSession.stream_steered, steering the generated positions: the prompt's KV cache reused, the decode
  steps in their own faster precision (GenerationConfig.decode_precision), the text streamed; time to the first
  token and to the whole summary;
- slider_all_positions: the same stream steering every position (the prompt is steered, so it runs again per λ);
- slider_compiled (where the compiled step applies: SteeringSession.compiles_decode; unless compiled=False): the
  slider's stream after SteeringSession.compile_decode(), what the Steering page takes once the step is built
  (compiled_decoder: ExportedDecoder on a CPU, CompiledDecoder on a GPU; compile_s: its first stream, which builds
  the step, or loads the package an earlier run built), and whether it wrote the slider's texts token for token
  (compiled_same_text); slider_compiled_all_positions: the same steering every position (the page's default: the
  prompt runs again, steered, before the step takes over).
Where both paths decode in the same precision on a CPU they write the same text, token for token (checked here, and
tested); where the decode precisions differ the texts may part after some tokens (bf16 and fp32 round differently),
and on a GPU in bf16 too (its kernels for a prompt's many rows and a step's one round differently: a random-weight
model's near-tied logits part within a few tokens). `streamed_same_text` says whether every λ's texts were the same.

    slider_vs_naive        slider whole summary / naive whole summary
    slider_compiled_vs_naive   the same with the compiled decode step
    first_token_vs_naive   slider first token / naive whole summary (when the naive page first shows a word)
    prefill_tokens_per_s, decode_ms_per_token   the two phases, from the naive path's prompt and the slider's decode
    linear_kernel          the kernel of the decode steps' float32 linears (hardware/linear_kernel.py; the naive
                           path's bf16 autocast ones are aten's)
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from ..hardware.linear_kernel import model_linear_kernel
from ..hardware.precision import resolve_precision
from ..inference.generate import GenerationConfig, generate, prefill
from ..runtime.modes import SteerConfig, steer
from ..runtime.session import SteeringSession

# λ positions a reader moves to, each new to the session (the vector mode's slider positions near the merged model)
NEW_POSITIONS = (0.25, 0.5, 0.75, 1.0, 1.25)


def _timed_stream(stream) -> tuple[float, float, str, int]:
    """(seconds to the first text, seconds to the last, the last text, how many texts: the new tokens, one text each)
    of a stream of texts. The tokens are counted as written: a text encoded again need not give them back (a tiny
    model's tokenizer decodes its random tokens to nothing)."""
    t0 = time.perf_counter()
    first, text, n = None, "", 0
    for n, text in enumerate(stream, 1):
        if first is None:
            first = time.perf_counter() - t0
    return first or 0.0, time.perf_counter() - t0, text, n


def slider_bench(
    session: SteeringSession,
    document: str,
    new_tokens: int = 64,
    precision: str = "auto",
    repeats: int = 3,
    log: Callable[[str], None] = print,
    compiled: bool = True,
) -> dict:
    """The module docstring's figures for `session` (a merged model and its vectors) on `document`; medians over
    `repeats` new λ positions per path."""
    lm = session.lm
    device = lm.model.device.type
    resolved = resolve_precision(precision, device)
    # the naive path runs every forward in one precision (as generation did before the decode steps had their own);
    # the slider's decode steps take their faster precision unless `precision` is explicit
    naive_gen = GenerationConfig(max_new_tokens=new_tokens, precision=resolved, decode_precision=resolved)
    gen = GenerationConfig.chosen(precision, max_new_tokens=new_tokens)
    decode = gen.decode_on(device)
    generated, everywhere = SteerConfig("vector", "generated"), SteerConfig("vector", "all")
    lambdas = NEW_POSITIONS[:repeats]
    # warm-up: the first generate after loading is slow; this also runs the document's prompt once, as the page has
    session.generate_steered(document, 0.0, gen, how=generated)
    [*session.stream_steered(document, 0.0, gen, how=generated)]
    prompt_tokens = prefill(lm, document, gen).length

    naive, slider, slider_all, tokens, texts, same = [], [], [], [], [], []
    for lam in lambdas:
        log(f"slider bench: λ = {lam:g}")
        t0 = time.perf_counter()
        with torch.no_grad(), steer(lm.model, session.vectors, lam, generated):
            naive_text = generate(lm, [document], naive_gen)[0]
        naive.append(time.perf_counter() - t0)
        first, total, text, n = _timed_stream(session.stream_steered(document, lam, gen, how=generated))
        if decode == resolved and device == "cpu" and text != naive_text:  # the same text, token for token (tested)
            raise AssertionError(f"λ = {lam}: the streamed text differs from generate()'s: {text!r} / {naive_text!r}")
        same.append(text == naive_text)
        slider.append((first, total))
        texts.append(text)
        slider_all.append(_timed_stream(session.stream_steered(document, lam + 0.01, gen, how=everywhere))[:2])
        tokens.append(n)
    t0 = time.perf_counter()
    for _ in range(repeats):
        prefill(lm, document, gen)
    prefill_s = (time.perf_counter() - t0) / repeats

    med = statistics.median
    naive_s, first_s, total_s = med(naive), med(s[0] for s in slider), med(s[1] for s in slider)
    n_new = med(tokens)
    with_compiled = {}
    if compiled:
        session.compile_decode()
    if compiled and session.compiles_decode(gen, generated):
        log("slider bench: the compiled decode step (its first stream compiles)")
        compile_s = _timed_stream(session.stream_steered(document, lambdas[0], gen, how=generated))[1]
        runs = [_timed_stream(session.stream_steered(document, lam, gen, how=generated)) for lam in lambdas]
        compiled_s = med(r[1] for r in runs)
        # every position steered (the Steering page's default): the prompt runs again, steered, before the step
        runs_all = [_timed_stream(session.stream_steered(document, lam + 0.01, gen, how=everywhere)) for lam in lambdas]
        with_compiled = {
            "compiled_decoder": type(session.decoder).__name__,  # ExportedDecoder on a CPU, CompiledDecoder on a GPU
            "compile_s": compile_s,
            "slider_compiled_s": compiled_s,
            "slider_compiled_vs_naive": compiled_s / naive_s,
            "decode_ms_per_token_compiled": 1000 * (compiled_s - med(r[0] for r in runs)) / max(n_new - 1, 1),
            "slider_compiled_all_positions_first_token_s": med(r[0] for r in runs_all),
            "slider_compiled_all_positions_s": med(r[1] for r in runs_all),
            "compiled_same_text": [r[2] for r in runs] == texts,
        }
    return {
        "model": lm.spec.name,
        "adapter": Path(session.vectors.adapter_path or "").name,
        "device": device,
        "precision": {"prefill": resolved, "decode": decode, "naive": resolved},
        "linear_kernel": model_linear_kernel(lm.model),  # the few-row float32 linears' (hardware/linear_kernel.py)
        "prompt_tokens": prompt_tokens,
        "new_tokens": n_new,
        "repeats": len(lambdas),
        "naive_s": naive_s,
        "slider_first_token_s": first_s,
        "slider_s": total_s,
        "slider_all_positions_first_token_s": med(s[0] for s in slider_all),
        "slider_all_positions_s": med(s[1] for s in slider_all),
        "slider_vs_naive": total_s / naive_s,
        "first_token_vs_naive": first_s / naive_s,
        "prefill_tokens_per_s": prompt_tokens / prefill_s,
        "decode_ms_per_token": 1000 * (total_s - first_s) / max(n_new - 1, 1),
        "naive_tokens_per_s": n_new / naive_s,
        "streamed_same_text": all(same),
        **with_compiled,
    }


GOALS = {
    "slider_vs_naive": ("<=", 0.35),
    "slider_compiled_vs_naive": ("<=", 0.35),
    "first_token_vs_naive": ("<=", 0.1),
}


def format_slider(res: dict) -> str:
    """The figures as a table, each goal of GOALS (the slider's targets) marked met or missed."""
    lines = [
        f"slider bench: {res['model']} + {res['adapter']} on {res['device']}, precision {res['precision']}, "
        f"few-row linears {res['linear_kernel']}"
    ]
    lines.append(f"prompt {res['prompt_tokens']} tokens, {res['new_tokens']} new tokens, median of {res['repeats']}")
    for k, v in res.items():
        if isinstance(v, bool):
            lines.append(f"{k:36s} {'yes' if v else 'NO'}")
        if k == "compiled_decoder":
            lines.append(f"{k:36s} {v}")
        if not isinstance(v, float):
            continue
        goal = GOALS.get(k)
        mark = "" if goal is None else f"  (goal {goal[0]} {goal[1]}: {'met' if v <= goal[1] else 'MISSED'})"
        lines.append(f"{k:36s} {v:10.3f}{mark}")
    return "\n".join(lines)
