"""The compiled decode step (inference/compiled_decode.py; CUDA graphs on a GPU) against the eager stream on one
model, unsteered: how many new tokens agree from the start, the first token's top-2 logit gap (a tie there makes the
two part at once: random weights have many), and the seconds of each after the compile. docs/scale.md.

    python scripts/compiled_decode_check.py --data cache/data/halueval-perturbed.jsonl --model qwen3-8b@random
"""

from __future__ import annotations

import argparse
import time

import torch

from topl_core.data.records import read_jsonl
from topl_core.inference.compiled_decode import CompiledDecoder
from topl_core.inference.generate import GenerationConfig, prefill, stream_generate
from topl_core.models.loading import ModelSpec, load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="qwen3-8b@random")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"), help="the weights' and the steps'")
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args()
    lm = load_model(ModelSpec(args.model, args.precision, "cuda" if torch.cuda.is_available() else "cpu"))
    document = read_jsonl(args.data)[0].document
    gen = GenerationConfig.chosen(args.precision, max_new_tokens=args.new_tokens)
    prompt = prefill(lm, document, gen)
    top = prompt.logits.float().topk(2).values
    print(f"first token's top-2 gap {float(top[0] - top[1]):.4f} (logits' spread {float(prompt.logits.std()):.3f})")
    t = time.perf_counter()
    eager = [*stream_generate(lm, document, gen, prefix=prompt)][-1]
    eager_s, decoder = time.perf_counter() - t, CompiledDecoder(lm)
    t = time.perf_counter()
    [*decoder.stream(prompt, gen, {})]
    compile_s, t = time.perf_counter() - t, time.perf_counter()
    compiled = [*decoder.stream(prompt, gen, {})][-1]
    compiled_s = time.perf_counter() - t
    a, b = lm.tokenizer(eager).input_ids, lm.tokenizer(compiled).input_ids
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"eager {eager_s:.2f} s, compiled {compiled_s:.2f} s after a {compile_s:.1f} s compile; "
          f"tokens agreeing from the start: {agree} of {len(a)}")  # fmt: skip
    print("eager:   ", eager[:200].replace("\n", " "))
    print("compiled:", compiled[:200].replace("\n", " "))


if __name__ == "__main__":
    main()
