"""Steps compiled ahead of time: AOTInductor packages built by a child process and kept in cache/decode-steps/ — the
Steering slider's one-stream step (exported_decode.py) and the service's batched step (batch_step.py).

    packages = AotPackages(lm, "topl_core.inference.batch_step")     the step module: its __main__ builds a package
    key = packages.key(*parts)        what the package's code depends on (the model's config and dtype, the linears'
        kernel, `parts`, the code of the step module, this module, the linears, models/forward.py and the attention
        of one query (code_only: not their docstrings, comments or layout), the libraries, the CPU's instruction set)
    packages.package(key, args) -> Path   built first where none is on disk: `python -m MODULE NAME DTYPE OUT *args`
        at the lowest CPU priority, an idle child (foundations/idle_children.py); one build of a key at a time across
        processes (another process's build is waited for, then taken)
    runner = packages.load(key, args, constants)   loaded (a corrupt or changed package is built again, once) and
        handed the caller's tensors without a copy (its weights and caches: user-managed constants)
    export_package(step, args, out, dynamic_shapes)   the child's work: torch.export, then AOTInductor

A package holds code, no weights (aot_inductor.package_constants_in_so off), so one serves every adapter of an
architecture. A build runs outside the app's interpreter: a build inside it (torch.compile) holds the interpreter's
lock for seconds at a time, and the page's eager streams and the service's requests would stall behind it.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.util
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import torch
import transformers

from ..foundations.cache_usage import enforce_cap, touch
from ..foundations.errors import ModelError
from ..foundations.idle_children import idle_child
from ..foundations.paths import cache_dir
from ..foundations.trusted_files import checksum_path, private_folder, record_checksum, trusted
from ..hardware import linear_kernel
from ..hardware.linear_kernel import KERNEL_ENV, model_linear_kernel
from ..models import forward, one_query_attention
from ..models.forward import bf16_step_tree
from ..models.loading import LoadedModel
from .compiled_decode import private_tree

BUILD_TIMEOUT_S = 1800  # a child building longer than this is stopped (SmolLM2's takes about a minute: performance.md)


def compiled_decode_wanted() -> bool:
    """Whether compiled decode steps are built and taken (docs/app.md, "Steering"; the service): TOPL_COMPILED_DECODE=0
    never, else (auto, the default) once built. Read at each use: a test may turn it on in a running process."""
    return os.environ.get("TOPL_COMPILED_DECODE", "auto") != "0"


def export_package(step: torch.nn.Module, args: tuple, out: Path, dynamic_shapes: tuple | None = None) -> None:
    """The child's work: export `step` on `args` and compile it into the package `out` (whole or absent: a killed
    build leaves no package)."""
    with torch.no_grad():  # not strict: half the tracing time (SmolLM2's step 10 s against 19; StepModule._start_step)
        program = torch.export.export(step, args=args, dynamic_shapes=dynamic_shapes, strict=False)
    partial = out.with_name(f"{out.stem}.{os.getpid()}.partial.pt2")
    config = {"aot_inductor.package_constants_in_so": False}
    torch._inductor.aoti_compile_and_package(program, package_path=str(partial), inductor_configs=config)
    os.replace(partial, out)


def step_constants(step: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a step's package reads, by the name export gave it (tied weights under each of their names)."""
    named = dict(step.named_parameters(remove_duplicate=False))
    named.update(step.named_buffers(remove_duplicate=False))
    return named


class StepModule(torch.nn.Module):
    """What an exported step holds: its own module tree over the model's weights (compiled_decode.private_tree), a
    static cache of `rows` rows and `capacity` positions whose layers are `layer_class` (their tensors registered as
    buffers: constants of the package), and a hook per shift path adding shifts[i] (width, or rows × width: set by
    the step's forward) to that module's output. `dtype`: what the step decodes in — the weights' own (None), or
    bf16 over float32 weights: bf16 autocast's step, written out (models/forward.bf16_step_tree), its cache bf16."""

    def __init__(
        self,
        model: torch.nn.Module,
        rows: int,
        capacity: int,
        layer_class: type,
        shift_paths: Sequence[str],
        dtype: torch.dtype | None = None,
    ):
        from transformers import StaticCache
        from transformers.integrations.executorch import get_head_shapes

        super().__init__()
        self.model = private_tree(model)
        dtype = dtype or model.dtype
        if dtype != model.dtype:
            if (dtype, model.dtype) != (torch.bfloat16, torch.float32):
                raise ValueError(f"a step decodes in its weights' {model.dtype} or, over float32, bf16; not {dtype}")
            bf16_step_tree(self.model)
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        heads, head_dim = get_head_shapes(model.config.get_text_config())
        self.cache.early_initialization(rows, heads, head_dim, dtype, model.device)
        for i, layer in enumerate(self.cache.layers):
            layer.__class__ = layer_class
            self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
        self._shifts: tuple[torch.Tensor, ...] = ()
        self.shift_sizes = []
        for i, path in enumerate(shift_paths):
            module = self.model.get_submodule(path)
            module.register_forward_hook(lambda _m, _i, out, i=i: out + self._shift(i, out))
            self.shift_sizes.append(module.weight.shape[0])

    def _start_step(self, position: torch.Tensor, shifts: tuple[torch.Tensor, ...]) -> None:
        """What a step's forward sets first: the shifts its hooks add, and every cache layer on this module's buffers
        (torch.export, not strict, traces the buffers as swapped in for the trace and the layers' own references to
        them as constants) writing at `position`."""
        self._shifts = shifts
        for i, layer in enumerate(self.cache.layers):
            layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            layer.position = position

    def _shift(self, i: int, out: torch.Tensor) -> torch.Tensor:
        # one row's, or each row's that reached this module (the first rows above a step's head layer)
        return self._shifts[i].reshape(-1, 1, out.shape[-1])[: out.shape[0]].to(out.dtype)


def _child_of_this_process() -> None:
    """In the child before it runs: the lowest CPU priority, and killed with its parent (Linux), so a build nobody
    will load does not take the cores after the app is stopped (SIGKILL: a stopped build ignores SIGTERM)."""
    os.nice(19)
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class AotPackages:
    """The packages of one model's steps of one kind (the module docstring)."""

    def __init__(self, lm: LoadedModel, module: str):
        self._lm, self._module = lm, module
        self._failed: dict[str, ModelError] = {}  # a build that failed is not tried again by this object
        self._said: set[str] = set()  # why a folder or a package was not trusted: said once

    def key(self, *parts: str) -> str:
        model = self._lm.model
        sources = (__file__, linear_kernel.__file__, forward.__file__, one_query_attention.__file__)
        sources += (importlib.util.find_spec(self._module).origin,)
        code = "".join(code_only(Path(f)) for f in sources)  # the step's code, and the linears' and layers' it traces
        fixed = (model.config.to_json_string(), str(model.dtype), model_linear_kernel(model), *parts)
        fixed += (hashlib.sha256(code.encode()).hexdigest(), torch.__version__, transformers.__version__)
        fixed += (torch.backends.cpu.get_cpu_capability(),)
        return hashlib.sha256("\n".join(fixed).encode()).hexdigest()[:20]

    def path(self, key: str) -> Path:
        """Where the package of `key` is kept: cache/decode-steps/ where no one but this user can write it (compiled
        code is loaded from there), else this user's own private folder, saying why."""
        folder, why = private_folder(cache_dir() / "decode-steps", "decode-steps")
        if why is not None:
            self._say(why)
        if folder is None:
            raise ModelError(f"no private folder for a compiled decode step ({why}); its work decodes eagerly.")
        return folder / f"{key}.pt2"

    def _say(self, why: str) -> None:
        if why not in self._said:
            self._said.add(why)
            warnings.warn(why, RuntimeWarning, stacklevel=4)

    def package(self, key: str, args: Sequence[str]) -> Path:
        """The package of `key`, built by a child process first where none is on disk."""
        out = self.path(key)
        if out.exists():
            return out
        if key in self._failed:
            raise self._failed[key]
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not out.exists():
                self._build(key, args, out)
                record_checksum(out)  # checked at every load (trusted_files.trusted)
                enforce_cap("decode-steps")  # the least recently used out first; this one's lock is held: kept
        return out

    def _build(self, key: str, args: Sequence[str], out: Path) -> None:
        spec = self._lm.spec
        command = [sys.executable, "-m", self._module, spec.name, spec.dtype, str(out), *args]
        env = {**os.environ, KERNEL_ENV: model_linear_kernel(self._lm.model)}  # the model the child loads: this one's
        child = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own: stopped whole (idle_child)
            preexec_fn=_child_of_this_process,
        )
        with idle_child(child):  # stopped while the app is busy (foundations/idle_children.py)
            try:
                _, err = child.communicate(timeout=BUILD_TIMEOUT_S)
                why = f"exit {child.returncode}: {err.strip()[-1500:]}"
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.communicate()
                why = f"stopped after {BUILD_TIMEOUT_S} s"
        if not out.exists():
            self._failed[key] = ModelError(
                f"building a compiled decode step of {spec.name} ({self._module.rsplit('.', 1)[-1]}) failed ({why}). "
                "Its work decodes eagerly; TOPL_COMPILED_DECODE=0 stops the app from trying."
            )
            raise self._failed[key]

    def load(self, key: str, args: Sequence[str], constants: Mapping[str, torch.Tensor] | None = None):
        """The package of `key` loaded, with `constants` (every name it reads) handed over without a copy (None: the
        caller binds them before the first call)."""
        path = self.package(key, args)
        if why := trusted(path):  # not private, or not the bytes its build left: built again, once
            self._say(f"{why}; building it again")
            path.unlink(missing_ok=True)
            checksum_path(path).unlink(missing_ok=True)
            path = self.package(key, args)
            if why := trusted(path):
                raise ModelError(f"the compiled decode step is not loaded: {why}; its work decodes eagerly.")
        touch(path)  # used now: the cache's cap evicts it after the packages unused longer
        try:
            runner = torch._inductor.aoti_load_package(str(path))
        except Exception:  # a corrupt or foreign file under the package's name: built again, once
            path.unlink(missing_ok=True)
            runner = torch._inductor.aoti_load_package(str(self.package(key, args)))
        if constants is not None:
            bind(runner, constants)
        return runner


def code_only(source: Path) -> str:
    """A Python file's code without its docstrings, comments and layout (its syntax tree): what a package built from
    it depends on, so that editing the words around the code does not rebuild every user's packages."""
    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def bind(runner, constants: Mapping[str, torch.Tensor]) -> None:
    """Hand a loaded package the tensors it reads (every name it asks for), without a copy: the caller's own."""
    wanted = {n: constants[n] for n in runner.get_constant_fqns()}
    runner.load_constants(wanted, check_full_update=True, user_managed=True)
