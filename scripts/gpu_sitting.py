"""The GPU sitting: the 8B presets' training step, the slider, the gated mode, the service and an exact resume measured
on a lent GPU, in parts that each fit one device call: every step under its own time limit, its output and JSON in one
folder, packed into ONE tar.gz in $OUT (so it comes back within the device's 8-file limit), and one
line per step (name, exit status, seconds). Steps run in order of value; a step that would overrun the part's budget
(BUDGET_S, default 480 s) is skipped and named, so a part ends in time and its tar.gz always comes back.

    .venv/bin/python scripts/gpu_sitting.py prepare        # HERE, once before the lease (needs the package registry)
    python3 scripts/gpu_sitting.py train                   # on the GPU machine: item 1   (the run calls below)
    python3 scripts/gpu_sitting.py serve                   # on the GPU machine: item 2 on the 8B preset
    python3 scripts/gpu_sitting.py extra                   # on the GPU machine: items 3, 4 and 2 on tiny-llama
    python3 scripts/gpu_sitting.py serve --only gated-8b   # one step again (--skip leaves steps out)
    DEVICE=cpu .venv/bin/python scripts/gpu_sitting.py train    # the dry run on a CPU: tiny models, 2 steps
    .venv/bin/python scripts/gpu_sitting.py plan           # every part's steps and command lines, nothing run

prepare stages what the offline GPU machine lacks, in git-excluded folders that the run calls carry:
- .whl/ (train, serve, extra) and .whl-pages/ (extra): the wheels of the packages the commands import that the
  machine's image lacks (KINDS.md's list, DEVICE_HAS below) or has in another version than the one tested here
  (transformers, peft), for CPython 3.12 x86-64, at the versions installed in .venv; a part installs them into
  /tmp/site and puts it first on PYTHONPATH;
- .gpu-stage/cache.tar.gz: the default data (cache/data/halueval-perturbed.jsonl) and SmolLM2's tokenizer, which the
  presets' random-weight builds ("qwen3-8b@random") use. SmolLM2's weights do not travel: the staged model.safetensors
  is a deliberately unreadable stub, so a command that loads SmolLM2 there fails loudly instead of running on random
  weights. prepare loads the tokenizer and the presets' configurations from the staged copy, checks the stub fails,
  and prints what each call carries against the device's 64 MiB.

The parts (GPU: random weights at the published shape, bf16; DEVICE=cpu: tiny-llama/-qwen3/-gemma3, 2 steps):
- train (item 1): the scale benchmark's TOPL and SFT step (`bench --device cuda --micro-batch-size 16
  --compile-backend inductor --skip fit capture steering sweep --steps 8`) on Qwen3-8B, Llama-3.1-8B, Gemma-3-4B, then
  scripts/gpu_profile_step.py on Qwen3-8B if time is left.
- serve (item 2, 8B): a TOPL run on qwen3-8b@random (`train --preset qwen3-8b`, 4 steps: the adapter the benches need),
  `bench --slider`, `bench --serve --clients 1 4 16` (--slots 32: every client decodes at once), `bench --gated`.
- extra (items 3, 4, and 2 on tiny-llama): gpu_check's tiny-llama TOPL run, the kill-and-resume (`gpu_check.py
  --steps resume`: the resumed run's tensors against the straight run's, bit for bit), the qwen3-8b@random run again
  (a fresh machine keeps nothing), every page's script under AppTest with TOPL_DEFAULT_MODEL="qwen3-8b@random|auto|cuda"
  and that run as the runs folder, `bench --slider`, `--gated` and `--serve --clients 1 4 16 64` on the tiny run, then
  `bench --serve --clients 64 --slots 128` on the 8B run.

The device calls (the `run` tool; first `status`, at no cost; then, here, `prepare` if .whl/, .whl-pages/ or .gpu-stage/
is missing: 7 s). Leave `kind` out: any one-GPU kind fits (the scale run's TOPL step peaked at 58-64 GiB on the
H200), every JSON and the tar.gz name their GPU, and MFU is against the matmul peak measured in the same run, so it
compares with the H200 rows of docs/scale.md (tokens/s and seconds do not, on an H100):

    1. run(command="python3 scripts/gpu_sitting.py train", carry=[".whl", ".gpu-stage"], timeout_s=560)
    2. at once (the machine stays warm 30 s after a call; a later call pays a fresh start), with L = reply 1's
       lease.budget_left_s: run(command="BUDGET_S=<L - 70> python3 scripts/gpu_sitting.py serve",
       carry=[".whl", ".gpu-stage"], timeout_s=<L - 30, at most 600>)
    3. the next GPU session: run(command="python3 scripts/gpu_sitting.py extra", carry=[".whl", ".whl-pages",
       ".gpu-stage"], timeout_s=560); then, with what is left, what was skipped: `extra --only serve-tiny
       serve-8b-many`, `train --only profile-qwen3-8b`, `serve --only ...` (a chosen step's needs run too).
The fourth H200 session (2026-11-29, docs/scale.md) ran `serve` and `extra` (serve-8b-many skipped); still to run:
`train`, `serve --only slider-8b`, `extra --only resume-tiny serve-8b-many`.

Estimated device time, from the H200 sessions (docs/scale.md; the third took 710 s for three calls with their
starts: an 8B scale run with fit, capture, steering and sweep skipped ~2-2.5 min, most of it compiling; a CLI process
13-17 s before its work, gpu_check's tiny-llama steps; the pages' scripts 33 s on tiny-llama; a steered 64-token
summary 1.7 s eager, 0.48 s compiled after a 32 s compile; a machine's start 1-2 min):
- train ~7.5 min: wheels and versions 0.5, Qwen3-8B 2.5, Llama-3.1-8B 2.5, Gemma-3-4B 2; the profile (1.5) runs only
  if the three leave it 90 s of the 480;
- serve ~5.5 min: wheels 0.5, the qwen3-8b@random run 1, slider 2 (the compiled step's 32 s build included), serve
  with 1, 4, 16 clients 1.5 (21 summaries one after another, then at once), gated 1;
- extra ~9 min of work, so its 480 s skip the tail: wheels 0.5, tiny run 0.5, resume 1, the 8B run 1, pages on it 3,
  tiny slider and gated 1.5, then (likely skipped) tiny serve with 1-64 clients 1 and 64 clients on the 8B run 3.
So one session (15 device minutes) holds a start, train and most or all of serve; extra needs the next. Nothing here
changes the card's settings.

What comes back: $OUT/gpu-<part>-<gpu>.tar.gz (gpu-<part>/: summary.txt, <step>.log, the JSONs, named for
docs/bench/ with the GPU: scale-<gpu>-qwen3-8b-mb16-inductor-8steps.json, slider-<gpu>-qwen3-8b-random.json, ...) and
$OUT/gpu-<part>-<gpu>-summary.txt. Without $OUT both go to /tmp/gpu-sitting/out (OUT_DIR overrides). Exit status 0 when
every step that ran passed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from topl_core.foundations.paths import cache_dir  # noqa: E402  (torch and the standard library: on every machine)
from topl_core.models.loading import converted_embedded_dir  # noqa: E402

STAGE = REPO / ".gpu-stage"  # the staged cache, packed: carried
WHEEL_DIRS = {"core": ".whl", "pages": ".whl-pages"}  # carried; installed into SITE on the GPU machine
EXCLUDED = ("/.whl/", "/.whl-pages/", "/.gpu-stage/")  # .git/info/exclude: none of it is committed
SITE = Path("/tmp/site")
DATA = "cache/data/halueval-perturbed.jsonl"  # the default data, under the (unpacked) cache folder
BUDGET_S = 480  # a part's default budget: ends well inside one call's 10 minutes, with the start and the transfer
PACK_S = 20  # kept back from the budget for packing the folder
CARRY_LIMIT = 64 * 2**20  # the device's limit on the working tree and what a call carries

# the packages the commands import (their requirements closed over .venv's metadata), per wheel folder
WHEEL_ROOTS = {
    "core": ("transformers", "peft", "openai", "fastapi", "uvicorn"),
    "pages": ("streamlit", "plotly", "umap-learn", "gguf"),
}
# the image has them, perhaps in another version: the one tested here, or the floor of a carried package's pin
# (pydantic: typing-extensions>=4.16; openai: anyio>=4.10)
CARRY_ANYWAY = {"transformers", "peft", "typing-extensions", "anyio"}
NOT_CARRIED = {"pydeck"}  # 7 MB of JavaScript; streamlit imports it only for st.pydeck_chart, which no page draws
# the Python packages of the GPU machines' image ('cuda'), from the device's KINDS.md, read 2026-11-17
DEVICE_HAS = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)


@dataclass(frozen=True)
class Mode:
    """What a part runs on: the GPU (the issue's models) or, DEVICE=cpu, tiny stand-ins and few steps."""

    device: str
    scale_models: tuple[str, ...]  # the scale benchmark's, one step each (the presets, or tiny ones of the same family)
    scale_steps: int
    micro_batch: int
    compile_backend: str
    big: str  # the model the 8B steps train and steer
    profile_model: str
    clients: tuple[int, ...]  # bench --serve on the 8B run
    clients_tiny: tuple[int, ...]
    clients_many: tuple[int, ...]
    slow: int  # the steps' time limits × this (the dry run's 2 loaded cores)


GPU = Mode(
    device="cuda",
    scale_models=("qwen3-8b", "llama3.1-8b", "gemma3-4b"),
    scale_steps=8,
    micro_batch=16,
    compile_backend="inductor",
    big="qwen3-8b@random",
    profile_model="qwen3-8b",
    clients=(1, 4, 16),
    clients_tiny=(1, 4, 16, 64),
    clients_many=(64,),
    slow=1,
)
DRY = Mode(
    device="cpu",
    scale_models=("tiny-qwen3", "tiny-llama", "tiny-gemma3"),
    scale_steps=2,
    micro_batch=2,
    compile_backend="",
    big="tiny-llama",
    profile_model="tiny-llama",
    clients=(1, 4),
    clients_tiny=(1, 4),
    clients_many=(4,),
    slow=3,
)


@dataclass
class Step:
    name: str
    args: list[str]  # after the interpreter
    timeout_s: int
    json: str | None = None  # the file its --json writes, in the part's folder
    needs: tuple[str, ...] = ()  # steps of this part that must have passed first
    env: dict[str, str] = field(default_factory=dict)
    min_s: int = 45  # not started with less time than this left
    fresh: Path | None = None  # a folder emptied first (a run there would be resumed, not trained anew)


class Paths:
    """Where a part works (WORK_DIR, default /tmp/gpu-sitting) and writes what comes back."""

    def __init__(self, part: str, tag: str):
        self.work = Path(os.environ.get("WORK_DIR", "/tmp/gpu-sitting"))
        self.cache = self.work / "cache"
        self.data = self.cache / DATA.removeprefix("cache/")
        self.runs_big = self.work / "runs-big"  # the runs folder of the pages: the 8B run alone
        self.runs_tiny = self.work / "runs-tiny"
        self.folder = f"gpu-{part}"
        self.out = self.work / "parts" / self.folder
        self.tag = tag


def scale_json(tag: str, model: str, mode: Mode) -> str:
    how = mode.compile_backend or "eager"
    return f"scale-{tag}-{model}-mb{mode.micro_batch}-{how}-{mode.scale_steps}steps.json"


def _bench(name: str, what: str, run: Path, json: str, p: Paths, timeout_s: int, *extra: str, **kw) -> Step:
    """`python -m topl_core bench --<what> --run <run> <extra> --json <the part's folder>/<json>`."""
    args = ["-m", "topl_core", "bench", f"--{what}", "--run", str(run), *extra, "--json", str(p.out / json)]
    return Step(name, args, timeout_s, json=json, **kw)


def _serve(name: str, run: Path, json: str, p: Paths, timeout_s: int, clients: tuple[int, ...], **kw) -> Step:
    """bench --serve with slots for every client at once (a steered request takes two)."""
    extra = ["--clients", *map(str, clients), "--slots", str(2 * max(clients))]
    return _bench(name, "serve", run, json, p, timeout_s, *extra, **kw)


def steps_of(part: str, mode: Mode, p: Paths) -> list[Step]:
    """The part's steps, in the order they run (the most valuable first)."""
    topl, data, dev = ["-m", "topl_core"], str(p.data), mode.device
    big = mode.big.replace("@", "-")  # in file names
    run_big, run_tiny = p.runs_big / f"topl-{big}", p.runs_tiny / "tiny-llama-topl"
    versions = Step("versions", ["-c", VERSIONS], 60, min_s=5)
    # the adapter the 8B benches and pages need: the paper's TOPL settings on the preset's random weights, 4 steps
    train_big = Step(
        "run-8b",
        [*topl, "train", "--preset", "qwen3-8b", "--model", mode.big, "--device", dev, "--data", data, "--out",
         str(run_big), *"--steps 4 --micro-batch-size 4 --max-val-examples 8 --eval-every 10".split()],
        300,
    )  # fmt: skip
    if part == "train":
        steps = [versions]
        for model in mode.scale_models:
            json = scale_json(p.tag, model, mode)
            args = [*topl, "bench", "--scale", "--device", dev, "--models", model, "--data", data, "--micro-batch-size",
                    str(mode.micro_batch), "--steps", str(mode.scale_steps), "--compile-backend", mode.compile_backend,
                    *"--skip fit capture steering sweep".split(), "--json", str(p.out / json)]  # fmt: skip
            steps.append(Step(f"scale-{model}", args, 240, json=json, min_s=90))
        profile = ["scripts/gpu_profile_step.py", "--data", data, "--model", mode.profile_model, "--device", dev,
                   "--micro-batch-size", str(mode.micro_batch), "--compile-backend", mode.compile_backend]  # fmt: skip
        return [*steps, Step(f"profile-{mode.profile_model}", profile, 180, min_s=90)]
    needs_big, needs_tiny = {"needs": ("run-8b",)}, {"needs": ("run-tiny",)}
    if part == "serve":
        return [
            versions,
            train_big,
            _bench("slider-8b", "slider", run_big, f"slider-{p.tag}-{big}.json", p, 240, min_s=90, **needs_big),
            _serve("serve-8b", run_big, f"serve-{p.tag}-{big}.json", p, 240, mode.clients, min_s=90, **needs_big),
            _bench("gated-8b", "gated", run_big, f"gated-{p.tag}-{big}.json", p, 180, min_s=60, **needs_big),
        ]
    if part == "extra":
        recipe = "--steps 20 --max-val-examples 8 --eval-every 10 --lora-layer-start 0 --lora-layer-end 2".split()
        tiny = [
            *topl,
            "train",
            "--model",
            "tiny-llama",
            "--device",
            dev,
            "--data",
            data,
            "--out",
            str(run_tiny),
            *recipe,
        ]
        resume = ["scripts/gpu_check.py", "--device", dev, "--models", "tiny-llama", "--steps", "resume", "--data",
                  data, "--work", str(p.work / "resume")]  # fmt: skip
        pages_env = {"TOPL_DEFAULT_MODEL": f"{mode.big}|auto|{dev}", "TOPL_RUNS_DIR": str(p.runs_big)}
        many = f"serve-{p.tag}-{big}-{max(mode.clients_many)}-clients.json"
        return [
            versions,
            Step("run-tiny", tiny, 120, min_s=30),  # gpu_check's TOPL run on tiny-llama
            Step("resume-tiny", resume, 180, min_s=60, fresh=p.work / "resume"),
            train_big,
            Step(
                "pages-8b", ["scripts/apptest_pages.py", "--timeout", "240"], 360, env=pages_env, min_s=90, **needs_big
            ),
            _bench("slider-tiny", "slider", run_tiny, f"slider-{p.tag}-tiny-llama.json", p, 150, **needs_tiny),
            _bench("gated-tiny", "gated", run_tiny, f"gated-{p.tag}-tiny-llama.json", p, 120, **needs_tiny),
            _serve("serve-tiny", run_tiny, f"serve-{p.tag}-tiny-llama.json", p, 180, mode.clients_tiny, **needs_tiny),
            _serve("serve-8b-many", run_big, many, p, 300, mode.clients_many, min_s=120, **needs_big),
        ]
    raise ValueError(f"no part {part!r}: train, serve or extra")


PARTS = ("train", "serve", "extra")
CARRY = {
    "train": (".whl", ".gpu-stage"),
    "serve": (".whl", ".gpu-stage"),
    "extra": (".whl", ".whl-pages", ".gpu-stage"),
}
VERSIONS = """
import importlib.metadata as m, platform, shutil, subprocess, torch
print("python", platform.python_version(), "torch", torch.__version__, "CUDA", torch.version.cuda)
print("device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA visible)")
for n in ("transformers", "peft", "accelerate", "tokenizers", "huggingface-hub", "openai", "fastapi", "streamlit"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "absent")
if shutil.which("nvidia-smi"):
    q = "name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm,power.limit"
    subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"])
"""


def gpu_tag(device: str) -> str:
    """The GPU's short name for file names ("h100", "h200"), from nvidia-smi; "cpu" for the dry run."""
    if device == "cpu":
        return "cpu"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "gpu"
    name = out.strip().splitlines()[0] if out.strip() else ""
    found = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", name)  # NVIDIA H100 80GB HBM3 -> h100
    return found.group(1).lower() if found else (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu")


def run_step(
    step: Step, env: dict, p: Paths, deadline: float, passed: set[str], lines: list[str], slow: int = 1
) -> int | None:
    """Run one step (its output into <name>.log), within its timeout and the part's deadline; a summary line."""
    left = deadline - time.monotonic()
    missing = [n for n in step.needs if n not in passed]
    if missing or left < step.min_s:
        why = f"needs {', '.join(missing)}" if missing else f"{left:.0f} s left of the budget, it needs {step.min_s}"
        return _say(lines, f"skip {step.name:18s} {'-':>4}  {0:6.1f} s  ({why})")
    limit = min(step.timeout_s * slow, left)
    if step.fresh is not None and step.fresh.exists():
        shutil.rmtree(step.fresh)
    cmd = [sys.executable, *step.args]
    log = p.out / f"{step.name}.log"
    t = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {''.join(f'{k}={shlex.quote(v)} ' for k, v in step.env.items())}{shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env={**env, **step.env}, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )  # its own group: a timeout ends all of it
        try:
            rc = proc.wait(limit)
        except subprocess.TimeoutExpired:
            _end_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            rc = 124
        _end_group(proc.pid, signal.SIGKILL)  # whatever it left running (a server, a worker)
        proc.wait()
    seconds = time.monotonic() - t
    if rc == 0:
        passed.add(step.name)
    got = f"  -> {step.json}" if step.json and (p.out / step.json).exists() else ""
    timed_out = f"  (stopped at its {limit:.0f} s limit)" if rc == 124 else ""
    _say(lines, f"{'ok  ' if rc == 0 else 'FAIL'} {step.name:18s} {rc:>4}  {seconds:6.1f} s{got}{timed_out}")
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        print("     " + "\n     ".join(tail), flush=True)
    return rc


def _end_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _say(lines: list[str], line: str) -> None:
    lines.append(line)
    print(line, flush=True)


def install_wheels(lines: list[str]) -> None:
    """The carried wheels into SITE (first on PYTHONPATH); nothing on the dry run, which has .venv."""
    wheels = sorted(str(w) for d in WHEEL_DIRS.values() for w in (REPO / d).glob("*.whl"))
    if not wheels:
        return _say(lines, "skip wheels             -       0.0 s  (none carried)")
    t = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(SITE),
            *wheels,
        ],
        capture_output=True,
        text=True,
    )
    _say(
        lines,
        f"{'ok  ' if out.returncode == 0 else 'FAIL'} {'wheels':18s} {out.returncode:>4}  "
        f"{time.monotonic() - t:6.1f} s  ({len(wheels)} wheels into {SITE})",
    )
    if out.returncode != 0:
        print("     " + "\n     ".join((out.stdout + out.stderr).strip().splitlines()[-12:]), flush=True)


def unpack_cache(p: Paths, lines: list[str]) -> None:
    packed = STAGE / "cache.tar.gz"
    if p.data.exists():
        return
    if not packed.exists():
        return _say(lines, f"FAIL cache                 -    0.0 s  ({packed} not carried: run prepare here first)")
    p.cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(packed) as tar:
        tar.extractall(p.cache, filter="data")
    _say(lines, f"ok   {'cache':18s} {0:>4}  {0:6.1f} s  (data and SmolLM2's tokenizer into {p.cache})")


def pack(p: Paths, part: str, lines: list[str]) -> Path:
    """The part's folder as one tar.gz (files over 8 MiB left out, and named) in $OUT, with the summary beside it."""
    out = Path(os.environ.get("OUT") or os.environ.get("OUT_DIR") or p.work / "out")
    out.mkdir(parents=True, exist_ok=True)
    big = [f for f in p.out.rglob("*") if f.is_file() and f.stat().st_size > 8 * 2**20]
    for f in big:
        _say(lines, f"left out of the tar.gz (over 8 MiB): {f.name}")
    (p.out / "summary.txt").write_text("\n".join(lines) + "\n")
    name = f"{p.folder}-{p.tag}"
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(p.out, arcname=p.folder, filter=lambda i: None if Path(p.out.parent, i.name) in big else i)
    shutil.copy(p.out / "summary.txt", out / f"{name}-summary.txt")
    return out / f"{name}.tar.gz"


def run_part(part: str, mode: Mode, budget: float, only: list[str], skip: list[str]) -> int:
    start = time.monotonic()
    deadline = start + budget - PACK_S
    p = Paths(part, gpu_tag(mode.device))
    if p.out.exists():
        shutil.rmtree(p.out)
    p.out.mkdir(parents=True)
    started = time.strftime("%F %T")
    lines = [f"# the GPU sitting, part {part} on {mode.device} ({p.tag}), budget {budget:.0f} s, {started}"]
    print(lines[0], flush=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOPL_CACHE_DIR": str(p.cache),
        "TOPL_RUNS_DIR": str(p.work / "runs"),
    }
    env.pop("TOPL_PRECISION", None)  # "auto", as a user gets it on the device
    if mode.device == "cuda":
        install_wheels(lines)
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(REPO)])
    else:
        env["PYTHONPATH"] = str(REPO)
    unpack_cache(p, lines)
    steps = steps_of(part, mode, p)
    unknown = set(only + skip) - {s.name for s in steps}
    if unknown:
        raise SystemExit(f"no step {sorted(unknown)} in part {part}: {[s.name for s in steps]}")
    needed = {n for s in steps if s.name in only for n in s.needs}  # what a chosen step needs runs too
    passed: set[str] = set()
    for step in steps:
        if step.name not in skip and (not only or step.name in only or step.name in needed):
            run_step(step, env, p, deadline, passed, lines, mode.slow)
    failed = [line for line in lines if line.startswith("FAIL")]
    _say(lines, f"part {part}: {len(passed)} passed, {len(failed)} failed, {time.monotonic() - start:.0f} s")
    packed = pack(p, part, lines)
    print(f"packed: {packed} ({packed.stat().st_size / 2**20:.2f} MiB)", flush=True)
    return 1 if failed else 0


def plan(mode: Mode) -> None:
    for part in PARTS:
        p = Paths(part, gpu_tag("cpu") if mode.device == "cpu" else "<gpu>")
        print(f"## {part} (carry {', '.join(CARRY[part])})")
        for s in steps_of(part, mode, p):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
            args = ["-c", "<VERSIONS>"] if s.args[0] == "-c" else s.args  # the versions step's code: VERSIONS
            print(f"{s.name:18s} {s.timeout_s:4d} s  {env + ' ' if env else ''}python3 {shlex.join(args)}")


# ---- prepare (here, where the package registry is reached) ----


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_sets() -> dict[str, dict[str, str | None]]:
    """{folder key: {package: version installed in .venv (None: not installed here)}}: the roots and what they need,
    closed over .venv's metadata for CPython 3.12 on Linux, less what the device's image has (DEVICE_HAS) unless
    CARRY_ANYWAY; the pages' set less the core's."""
    from importlib import metadata

    from packaging.requirements import Requirement

    marker_env = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "os_name": "posix",
        "extra": "",
    }

    def closure(roots: tuple[str, ...]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        todo = [_norm(r) for r in roots]
        while todo:
            name = todo.pop()
            if name in found or name in NOT_CARRIED or (name in DEVICE_HAS and name not in CARRY_ANYWAY):
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                found[name] = None
                continue
            found[name] = dist.version
            for text in dist.requires or []:
                req = Requirement(text)
                if req.marker is None or req.marker.evaluate(marker_env):
                    todo.append(_norm(req.name))
        return found

    core = closure(WHEEL_ROOTS["core"])
    pages = {k: v for k, v in closure(WHEEL_ROOTS["pages"]).items() if k not in core}
    return {"core": core, "pages": pages}


PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
)


def download_wheels(folder: Path, packages: dict[str, str | None]) -> None:
    """`packages` as CPython 3.12 x86-64 wheels into `folder` (emptied first)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    specs = [f"{k}=={v}" if v else k for k, v in sorted(packages.items())]
    platforms = [a for pl in PLATFORMS for a in ("--platform", pl)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(folder),
        *specs,
    ]
    print("pip download:", " ".join(specs), flush=True)
    subprocess.run(cmd, check=True)


def stage_cache() -> None:
    """.gpu-stage/cache.tar.gz: the default data and SmolLM2's tokenizer with an unreadable weights stub."""
    data = cache_dir() / DATA.removeprefix("cache/")
    if not data.exists():
        raise SystemExit(f"{data}: missing; build it first (make setup)")
    smollm2 = converted_embedded_dir("smollm2-135m")
    STAGE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "models" / "smollm2-135m"
        model.mkdir(parents=True)
        for f in smollm2.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors"):
                shutil.copy(f, model / f.name)
        # any *.safetensors makes converted_embedded_dir take the folder as converted; this one cannot be read
        (model / "model.safetensors").write_bytes(
            b"\xff" * 8 + b" SmolLM2's weights do not travel to the GPU machine: only its tokenizer is here."
        )
        with tarfile.open(STAGE / "cache.tar.gz", "w:gz") as tar:
            tar.add(data, arcname=DATA.removeprefix("cache/"))
            tar.add(model, arcname="models/smollm2-135m")


STAGE_CHECK = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
from topl_core.models.loading import converted_embedded_dir, preset_model_config
where = converted_embedded_dir("smollm2-135m")
tok = AutoTokenizer.from_pretrained(where)
print("tokenizer", type(tok).__name__, len(tok), "ids of 'The council':", tok("The council").input_ids)
for preset in ("qwen3-8b", "llama3.1-8b", "gemma3-4b"):
    c = preset_model_config(preset)
    print(preset, c.model_type, c.num_hidden_layers, "layers, vocab", c.vocab_size)
try:
    AutoModelForCausalLM.from_pretrained(where)
except Exception as e:
    print("SmolLM2's weights fail to load, as meant:", type(e).__name__)
else:
    sys.exit("the weights stub loaded: a command could run SmolLM2 on random weights there")
"""


def working_tree_bytes() -> int:
    """What travels of the repository: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def prepare(download: bool = True) -> int:
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(exist_ok=True)
    have = exclude.read_text().splitlines() if exclude.exists() else []
    with open(exclude, "a") as f:
        for line in EXCLUDED:
            if line not in have:
                f.write(line + "\n")
    stage_cache()
    if download:
        for key, packages in wheel_sets().items():
            missing = [k for k, v in packages.items() if v is None]
            if missing:
                print(f"not installed in .venv, downloaded at the newest version: {missing}")
            download_wheels(REPO / WHEEL_DIRS[key], packages)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(STAGE / "cache.tar.gz") as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "TOPL_CACHE_DIR": tmp, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        check = subprocess.run([sys.executable, "-c", STAGE_CHECK], cwd=REPO, env=env)
    tree = working_tree_bytes()
    print(f"the working tree: {tree / 2**20:.1f} MiB")
    over = False
    for part, carried in CARRY.items():
        sizes = {c: folder_bytes(REPO / c) for c in carried}
        total = tree + sum(sizes.values())
        over |= total > CARRY_LIMIT
        said = ", ".join(f"{c} {b / 2**20:.1f}" for c, b in sizes.items())
        print(f"{part}: {total / 2**20:.1f} MiB of {CARRY_LIMIT // 2**20} ({said})")
    return 1 if over or check.returncode else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=(*PARTS, "prepare", "plan"))
    p.add_argument("--only", nargs="+", default=[], help="run these steps of the part (and what they need)")
    p.add_argument("--skip", nargs="+", default=[], help="leave these steps of the part out")
    p.add_argument(
        "--budget",
        type=float,
        default=float(os.environ.get("BUDGET_S", BUDGET_S)),
        help="seconds the part may take in all (BUDGET_S)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=os.environ.get("DEVICE", "cuda"),
        help="cpu: the dry run (DEVICE=cpu)",
    )
    p.add_argument("--no-download", action="store_true", help="prepare: stage the cache only, keep the wheels")
    args = p.parse_args()
    mode = DRY if args.device == "cpu" else GPU
    if args.part == "prepare":
        return prepare(download=not args.no_download)
    if args.part == "plan":
        plan(mode)
        return 0
    return run_part(args.part, mode, args.budget, args.only, args.skip)


if __name__ == "__main__":
    sys.exit(main())
