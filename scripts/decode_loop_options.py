"""Measure ways to run the decode loop (the Steering page's slider waits on it), one sitting, one machine: SmolLM2-135M
with the demo TOPL adapter merged, the first test document's prompt reused (as the slider does), 64 new tokens,
greedy, batch 1. Each option decodes from the same prompt and is checked token for token against the plain loop in its
precision; the figures are ms per new token, median of `--repeats`.

    plain-fp32         stream_generate: one eager forward per token, float32 weights, the prompt's cache copied once
                       into storage with room for the new tokens (kv_cache.with_room; before 2026-11-26 afternoon a
                       DynamicCache concatenating every step: the table in docs/performance.md is from then)
    plain-bf16-cast    the same under bf16 autocast over float32 weights (what `auto` decoded in before)
    bf16-weights       a bf16 copy of the merged model, eager, no autocast (no cast per call; twice the weights' memory)
    static-fp32        transformers' generate with a StaticCache, eager
    static-compiled    the same with the decode step compiled (torch.compile, CompileConfig; its compile time apart)
    steered-compiled   a StaticCache loop of ours whose compiled step runs forward hooks adding λ · delta at four
                       down_proj sites, λ read from a tensor set in place: per λ against the same hooks eager, and
                       how many graphs dynamo built for all of them (what steering needs to decode compiled)
    python-overhead    the share of a plain fp32 step spent outside torch's operators (torch.profiler, 16 steps)
    plain-fp32-thread  the plain fp32 loop in a thread of its own, after this (main) thread has run torch, as a
                       Streamlit page's script thread decodes: with more OpenMP threads alive than cores, GNU
                       OpenMP spins only briefly before sleeping between parallel regions

    PYTHONPATH=$PWD .venv/bin/python scripts/decode_loop_options.py [--json docs/bench/decode-loop-<cpu>.json]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import threading
import time
from dataclasses import replace

import torch

from topl_core.data.encode import build_prompt, truncate_document
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.io import write_json
from topl_core.hardware.machine import machine_description
from topl_core.inference.generate import GenerationConfig, load_merged, prefill, stream_generate
from topl_core.models.architecture import decoder_layers
from topl_core.training.adapters import open_adapter

ADAPTER = "examples/adapters/topl-smollm2"
NEW_TOKENS = 64


def _ids(lm, text: str) -> list[int]:
    return lm.tokenizer(text, add_special_tokens=False).input_ids


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _stream(lm, document: str, cfg: GenerationConfig, prefix) -> str:
    *_, text = stream_generate(lm, document, cfg, prefix=prefix)
    return text


def _static_generate(lm, document: str, cfg: GenerationConfig, compiled: bool) -> str:
    from transformers import CompileConfig

    tok, model = lm.tokenizer, lm.model
    prompt = build_prompt(tok, truncate_document(tok, document, cfg.max_doc_tokens), "summarization", None)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    extra: dict = {"disable_compile": True}
    if compiled:  # transformers compiles on accelerators only, unless the config says every device
        config = CompileConfig(fullgraph=False, dynamic=False)
        config._compile_all_devices = True
        extra = {"compile_config": config}
    out = model.generate(
        **enc,
        max_new_tokens=cfg.max_new_tokens,
        do_sample=False,
        cache_implementation="static",
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **extra,
    )
    return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()


STEERED_LAYERS = (8, 10, 12, 14)  # steered-compiled: the down_proj sites its hooks edit
STEERED_LAMBDAS = (0.0, 2.0, 4.0)


def _steered_compiled(lm, document: str, cfg: GenerationConfig, repeats: int) -> dict:
    """The decode step compiled once, with forward hooks that add λ · delta (a seeded random direction per site) at
    STEERED_LAYERS' down_proj, λ read from a float64 tensor set in place between generations. The hooks check no
    thread (the steering hooks check the calling thread: for dynamo a graph break in every hook, measured slower than
    eager). Per λ: ms per token compiled and eager (the same hooks and loop), whether the texts agree; the graphs
    dynamo built for all λ; the first call's time (compiling)."""
    import torch._dynamo
    from transformers import StaticCache

    tok, model = lm.tokenizer, lm.model
    prompt = build_prompt(tok, truncate_document(tok, document, cfg.max_doc_tokens), "summarization", None)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    length = ids.shape[1]
    prompt_cache = StaticCache(config=model.config, max_cache_len=length + cfg.max_new_tokens)
    first = model(
        input_ids=ids, past_key_values=prompt_cache, use_cache=True, cache_position=torch.arange(length),
        logits_to_keep=1,
    ).logits[0, -1].float()  # fmt: skip
    work = copy.deepcopy(prompt_cache)  # one cache the compiled step reads: a new one per λ would recompile

    def decode(step) -> tuple[str, int]:
        for a, b in zip(work.layers, prompt_cache.layers):  # back to the prompt, its position counter too
            a.keys.copy_(b.keys)
            a.values.copy_(b.values)
            a.cumulative_length.copy_(b.cumulative_length)
        logits, new = first, []
        while True:
            new.append(int(logits.argmax()))
            if len(new) == cfg.max_new_tokens:
                return tok.decode(new, skip_special_tokens=True).strip(), len(new)
            position = torch.tensor([length + len(new) - 1])
            out = step(
                input_ids=torch.tensor([new[-1:]]), past_key_values=work, use_cache=True, cache_position=position
            )
            logits = out.logits[0, -1].float()

    lam = torch.zeros((), dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    handles = []
    for layer in STEERED_LAYERS:
        delta = 0.5 * torch.randn(model.config.hidden_size, generator=generator)

        def add(_module, _inputs, output, delta=delta):
            return output + (lam * delta).to(output.dtype)

        handles.append(decoder_layers(model)[layer].mlp.down_proj.register_forward_hook(add))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = torch.compile(model.forward, dynamic=False)
    rows = {}
    try:
        t = time.perf_counter()
        decode(compiled)
        first_call_s = time.perf_counter() - t
        for value in STEERED_LAMBDAS:
            lam.fill_(value)
            eager_s, (eager_text, n) = _timed(lambda: decode(model.forward), repeats)
            compiled_s, (text, _) = _timed(lambda: decode(compiled), repeats)
            rows[f"{value:g}"] = {
                "eager_ms_per_token": 1000 * eager_s / n,
                "compiled_ms_per_token": 1000 * compiled_s / n,
                "same_text": text == eager_text,
            }
            row = rows[f"{value:g}"]
            print(
                f"steered-compiled λ={value:g}: eager {row['eager_ms_per_token']:.1f}, compiled "
                f"{row['compiled_ms_per_token']:.1f} ms/token; same text {row['same_text']}",
                flush=True,
            )
    finally:
        for h in handles:
            h.remove()
    return {
        "first_call_s": first_call_s,
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
        "lambdas": rows,
    }


def _python_share(lm, document: str, cfg: GenerationConfig, prefix) -> float:
    """1 − (time inside torch's operators) / wall time, over 16 plain fp32 decode steps."""
    from torch.profiler import ProfilerActivity, profile

    cache, token = copy.deepcopy(prefix.cache), int(prefix.logits.argmax())
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(16):
            out = lm.model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            token = int(out.logits[0, -1].argmax())
        wall = time.perf_counter() - t
    # top-level operators only: an aten op's own children are inside its time
    inside = sum(e.cpu_time_total for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))
    return 1 - inside / 1e6 / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--skip-compile", action="store_true", help="leave out static-compiled (its compile takes minutes)")
    args = p.parse_args()
    adapter = open_adapter(ADAPTER)
    document = split_records(read_jsonl(adapter.settings.data), seed=adapter.settings.split_seed)["test"][0].document
    lm = load_merged(adapter.base_model, adapter)
    fp32 = GenerationConfig(max_new_tokens=NEW_TOKENS, precision="fp32")
    cast = GenerationConfig(max_new_tokens=NEW_TOKENS, precision="bf16", decode_precision="bf16")
    rows: dict[str, dict] = {}

    def record(name: str, seconds: float, text: str, reference: str, **extra) -> None:
        n = len(_ids(lm, text))
        rows[name] = {"ms_per_token": 1000 * seconds / max(n, 1), "tokens": n, "same_text": text == reference, **extra}
        print(f"{name:18s} {rows[name]['ms_per_token']:7.1f} ms/token  same text: {text == reference}", flush=True)

    with torch.no_grad():
        prefix32, prefix16 = prefill(lm, document, fp32), prefill(lm, document, cast)
        _stream(lm, document, fp32, prefix32)  # warm-up
        s, ref32 = _timed(lambda: _stream(lm, document, fp32, prefix32), args.repeats)
        record("plain-fp32", s, ref32, ref32, prompt_tokens=prefix32.length)
        s, ref16 = _timed(lambda: _stream(lm, document, cast, prefix16), args.repeats)
        record("plain-bf16-cast", s, ref16, ref16)
        weights16 = copy.deepcopy(lm)
        weights16.model = weights16.model.to(torch.bfloat16)
        prefix_w16 = prefill(weights16, document, fp32)  # fp32 "precision" = no autocast over the bf16 weights
        s, text = _timed(lambda: _stream(weights16, document, fp32, prefix_w16), args.repeats)
        record("bf16-weights", s, text, ref16)
        # generate() runs the prompt too: its decode steps are the time of 64 new tokens less that of 1 (the same
        # prompt forward in both, with the last position's logits only), as 63 steps of the plain loop's 64 tokens
        one = replace(fp32, max_new_tokens=1)
        first_s, _ = _timed(lambda: _static_generate(lm, document, one, compiled=False), args.repeats)
        s, text = _timed(lambda: _static_generate(lm, document, fp32, compiled=False), args.repeats)
        record("static-fp32", s - first_s, text, ref32)
        if not args.skip_compile:
            t = time.perf_counter()
            _static_generate(lm, document, fp32, compiled=True)
            compile_s = time.perf_counter() - t
            first_s, _ = _timed(lambda: _static_generate(lm, document, one, compiled=True), args.repeats)
            s, text = _timed(lambda: _static_generate(lm, document, fp32, compiled=True), args.repeats)
            record("static-compiled", s - first_s, text, ref32, first_call_s=compile_s)
            rows["steered-compiled"] = _steered_compiled(lm, document, fp32, args.repeats)
        in_thread: list[tuple[float, str]] = []  # (seconds, text) of the loop run in a thread of its own
        worker = threading.Thread(
            target=lambda: in_thread.append(_timed(lambda: _stream(lm, document, fp32, prefix32), args.repeats))
        )
        worker.start()
        worker.join()
        record("plain-fp32-thread", *in_thread[0], ref32)
        share = _python_share(lm, document, fp32, prefix32)
        rows["python-overhead"] = {"share_of_step": share}
        print(f"python-overhead    {100 * share:.0f}% of a plain fp32 step outside torch's operators")
    result = {
        "machine": machine_description(),
        "threads": torch.get_num_threads(),
        "model": adapter.base_model,
        "adapter": ADAPTER,
        "new_tokens": NEW_TOKENS,
        "repeats": args.repeats,
        "options": rows,
    }
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
