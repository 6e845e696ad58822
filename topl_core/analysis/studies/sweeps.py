"""Sliding-window layer sweep (docs/design.md §2, "Layer selection"): TOPL trained with LoRA on layers [s, s+k) and
the head after layer s+k−1, for a grid of windows (start s, size k), each scored by the head's token AUROC on the
validation split (and optionally by the factuality of the merged model's generations).

Public API
    plan_windows(num_layers, sizes=(3, 6, 12), stride=3) -> list[Window]
    SweepConfig(train=TrainConfig(...), sizes, stride, windows=(), reuse_prefix=True, n_generate=0, ...)
    run_sweep(cfg, sweep_dir, progress=None, base_loader=None, records=None) -> DataFrame  (foreground; resumable)
    save_sweep_config(sweep_dir, cfg)            write sweep.json (refusing a different sweep in the folder)
    read_sweep(sweep_dir) -> pandas.DataFrame    results so far (one row per finished window)
    (in the background: jobs/launchers.py's launch_sweep; state and stop: jobs/background.py's read_job / cancel)
    heatmap_table(df, value="val_token_auroc") -> DataFrame (rows start, columns size)
    lines_table(df, sizes=(3, 6, 12)) -> DataFrame (one line per size: x = start, y = value)
    compare_reuse(df_reuse, df_plain) -> DataFrame  per-window time with / without prefix reuse, AUROC of both
    (the benchmark of reuse, the same windows trained with and without it: bench/workbench.py's benchmark_prefix_reuse)

    The forward from an intermediate hidden state is topl_core/models/architecture.py (forward_from_hidden); the prefix
    store is topl_core/training/prefix_cache.py.

Layout of a sweep directory (resumable: finished windows are kept and never redone):
    sweep.json          {"config": SweepConfig}
    status.json, STOP   state, done / total windows and the current one; a stop request (topl_core.foundations.status)
    results.jsonl       one row per finished window
    windows/s{start:02d}-k{size:02d}/   a normal run directory (topl_core.training.run_dirs) per window
    job.json, job.log   when started in the background (topl_core.jobs.background)

Frozen-prefix reuse. Layers below a window carry no LoRA, so the residual stream entering layer s is the base
model's, identical for every window that starts at s or above. With `reuse_prefix=True`, windows run in order of
start; a PrefixStore keeps, per training/validation batch (keyed by its token ids), the hidden state entering the
current start layer, and advances it layer by layer as the start moves up. Each window's model then runs only
layers s..m (m = the head layer) from the stored state. The trainer is unchanged: `install_prefix_cache` swaps the
window's own freshly loaded model's decoder stack (`model.model`) for a `PrefixCachedDecoder` that holds the same
embedding, layers, norm and rotary modules (so PEFT module names and saved adapter keys are the usual ones) and
whose forward starts from the stored state. With dropout-free base layers (attention_dropout = 0, as in Llama,
Qwen3, Gemma3 checkpoints) the result equals the plain forward; `run_sweep` refuses reuse otherwise.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np

from ...data.records import read_jsonl
from ...data.split import first_documents, split_records
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError, RunError
from ...foundations.executor import ExecutorConfig, failure_report, run_tasks, worker_memo
from ...foundations.io import read_log_rows, write_json
from ...foundations.status import WriterLock, clear_stop, stop_requested, write_status
from ...inference.generate import GenerationConfig, generate, load_merged
from ...models.loading import LoadedModel, ModelSpec, layer_count, load_model
from ...training.config import TrainConfig
from ...training.prefix_cache import PrefixStats, PrefixStore, install_prefix_cache
from ...training.run_dirs import RunDir
from ...training.tracking import check_trackers
from ...training.trainer import train
from ..evaluation.scorers import make_scorer, score_summary
from .study import Study, StudyConfig
from .sweep_results import RESULTS_FILE, read_sweep

# --- windows and config -----------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Window:
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size - 1

    @property
    def name(self) -> str:
        return f"s{self.start:02d}-k{self.size:02d}"


def plan_windows(num_layers: int, sizes: Sequence[int] = (3, 6, 12), stride: int = 3) -> list[Window]:
    """Every window of each size whose start is a multiple of `stride` and that fits in the model, ordered by start."""
    if stride < 1:
        raise ConfigError(f"stride={stride!r}: use a positive layer step (e.g. 3).")
    out = []
    for k in sizes:
        if not 1 <= k <= num_layers:
            raise ConfigError(f"window size {k!r}: must lie in 1..{num_layers} (the model's layers).")
        out += [Window(s, k) for s in range(0, num_layers - k + 1, stride)]
    return sorted(set(out))


@dataclass(frozen=True)
class SweepConfig(StudyConfig):
    """A sliding-window sweep. `train` is the template for every window (its LoRA layer range is replaced by the
    window; method must be "topl"). `windows` (explicit (start, size) pairs) overrides sizes/stride."""

    sizes: tuple[int, ...] = config_field((3, 6, 12), label="Window sizes k", help="window sizes k")
    stride: int = config_field(3, label="Start every … layers", help="start layers 0, stride, 2·stride, …", min=1)
    windows: tuple[tuple[int, int], ...] = config_field(
        (), label="Windows", help="explicit (start, size) windows instead of sizes and stride"
    )
    reuse_prefix: bool = config_field(
        True,
        label="Reuse frozen prefix",
        help="layers below a window carry no LoRA: their activations are computed once and reused (off: every "
        "window from the embeddings, for timing)",
    )

    what_it_trains: ClassVar[str] = "the layer sweep trains TOPL windows"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sizes", tuple(int(k) for k in self.sizes))
        object.__setattr__(self, "windows", tuple((int(s), int(k)) for s, k in self.windows))
        if not self.windows and not self.sizes:
            raise ConfigError("sizes=() and windows=(): give window sizes (e.g. 3 6 12) or explicit windows.")

    def window_list(self, num_layers: int) -> list[Window]:
        if self.windows:
            ws = sorted({Window(s, k) for s, k in self.windows})
            bad = [w for w in ws if w.start < 0 or w.size < 1 or w.end >= num_layers]
            if bad:
                raise ConfigError(f"windows {[(w.start, w.size) for w in bad]} do not fit layers 0..{num_layers - 1}.")
            return ws
        return plan_windows(num_layers, self.sizes, self.stride)

    def window_config(self, w: Window) -> TrainConfig:
        return self.train.with_overrides(lora_layer_start=w.start, lora_layer_end=w.end)

    def to_json(self) -> dict:
        d = asdict(self)
        d["train"] = self.train.to_json()
        d["sizes"], d["windows"] = list(self.sizes), [list(w) for w in self.windows]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "SweepConfig":
        d = dict(d)
        d["train"] = TrainConfig.from_json(d["train"])
        return cls(**d)


# --- running --------------------------------------------------------------------------------------------------

SweepProgress = Callable[[dict], "bool | None"]  # {"event": ..., "window": name, ...}; return False to cancel
CONFIG_FILE = "sweep.json"


def save_sweep_config(sweep_dir: str | Path, cfg: SweepConfig, executor: ExecutorConfig | None = None) -> None:
    """Write cfg as the sweep's config (and where its windows run: not part of what the sweep computes, so a resume
    may change it), refusing a folder that holds a sweep with another training/reuse config."""
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / CONFIG_FILE
    if path.exists():
        try:
            old = SweepConfig.from_json(json.loads(path.read_text())["config"])
        except (json.JSONDecodeError, KeyError, TypeError, ConfigError) as e:
            raise RunError(f"{path}: corrupt ({e}); delete the sweep directory to start over.") from e
        fixed = lambda c: replace(c, sizes=(), stride=1, windows=((0, 1),), n_generate=0)  # noqa: E731
        if fixed(old) != fixed(cfg) or old.n_generate != cfg.n_generate:
            raise RunError(
                f"{sweep_dir} holds a sweep with a different training/reuse config; resume it with its own config "
                f"(python -m topl_core sweep --resume {sweep_dir}) or use another --out directory."
            )
    write_json(path, {"config": cfg.to_json(), "executor": (executor or ExecutorConfig()).to_json()})


def saved_executor(sweep_dir: str | Path) -> ExecutorConfig:
    """Where the sweep in sweep_dir last ran its windows (local when it has not run or the field is missing)."""
    try:
        return ExecutorConfig.from_json(json.loads((Path(sweep_dir) / CONFIG_FILE).read_text()).get("executor"))
    except (OSError, json.JSONDecodeError, TypeError):
        return ExecutorConfig()


def _window_row(w: Window, run: RunDir, train_s: float, store: PrefixStore | None, before: PrefixStats | None) -> dict:
    metrics = run.read_metrics()
    val = next((r for r in reversed(metrics) if "val_token_auroc" in r), {})
    last = metrics[-1] if metrics else {}
    row = {
        "window": w.name,
        "start": w.start,
        "size": w.size,
        "end": w.end,
        "head_layer": w.end,
        "val_token_auroc": val.get("val_token_auroc", float("nan")),
        "val_tokens": val.get("val_tokens", 0),
        "loss": last.get("loss", float("nan")),
        "steps": last.get("step", 0),
        "train_s": train_s,
        "reuse_prefix": store is not None,
        "run": str(run.path),
        "finished": time.time(),
    }
    if store is not None:  # what this window's prefix work was (the store's counters are cumulative)
        now, then = asdict(store.stats), asdict(before or PrefixStats())
        row.update({f"prefix_{k}": now[k] - then[k] for k in now})
        row["prefix_store_mb"] = store.nbytes / 2**20
    return row


def _generation_factuality(cfg: SweepConfig, run: RunDir, records) -> dict:
    test = split_records(records, seed=cfg.train.split_seed)["test"]
    docs = [r.document for r in first_documents(test, cfg.n_generate)]
    lm = load_merged(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device), run)
    texts = generate(
        lm,
        docs,
        GenerationConfig(
            max_new_tokens=cfg.max_new_tokens, max_doc_tokens=cfg.train.max_doc_tokens, precision=cfg.train.precision
        ),
    )
    scorer = make_scorer(cfg.scorer)
    scores = [score_summary(scorer, d, t, "sentence") for d, t in zip(docs, texts)]
    return {
        "gen_factuality": float(np.mean([s.score for s in scores])) if scores else float("nan"),
        "gen_sentences": float(np.mean([s.n_sentences for s in scores])) if scores else float("nan"),
        "gen_documents": len(docs),
        "scorer": scorer.name,
    }


def sweep_inputs(cfg: SweepConfig, base_loader: Callable[[], LoadedModel] | None, records) -> tuple[LoadedModel, list]:
    """The base model (loaded once per sweep; default: the config's model, its weights for the run's precision) and
    the records (default: the config's data file)."""
    base = (
        base_loader()
        if base_loader
        else load_model(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device))
    )
    return base, list(records) if records is not None else read_jsonl(cfg.train.data)


def fresh_copy(base: LoadedModel) -> LoadedModel:
    """A deep copy for one window (training injects LoRA into the model it gets): the base is loaded once per
    worker, as copying it is faster than loading it again (docs/performance.md, "Figures behind the code's choices")."""
    return LoadedModel(copy.deepcopy(base.model), base.tokenizer, base.spec)


def train_window(sweep: Study[SweepConfig], w: Window) -> dict:
    """One window of the sweep as a task (topl_core.foundations.executor): train windows/<name> — or resume it from its
    checkpoint, or find it complete — and return its results row; {"cancelled": ...} when the sweep was asked to
    stop. The worker keeps the base model (each window trains a deep copy) and the prefix store between windows."""
    cfg, sweep_dir = sweep.cfg, sweep.folder
    if stop_requested(sweep_dir):
        return {"cancelled": w.name}
    if sweep.progress is not None:
        sweep.progress({"event": "window", "window": w.name, "start": w.start, "size": w.size})
    base = worker_memo("base", str(sweep_dir), lambda: sweep_inputs(cfg, sweep.base_loader, ())[0])
    store = worker_memo("prefix", str(sweep_dir), PrefixStore) if cfg.reuse_prefix else None

    def step(p) -> bool:
        if stop_requested(sweep_dir):
            return False
        event = {"event": "step", "window": w.name, "step": p.step, "steps": p.steps, "loss": p.loss, "val": p.val}
        return sweep.progress is None or sweep.progress(event) is not False

    run_path = sweep_dir / "windows" / w.name
    t0 = time.perf_counter()
    before = replace(store.stats) if store is not None else None
    run = RunDir(run_path)
    if not run.is_complete:
        lm = fresh_copy(base)
        if store is not None:
            install_prefix_cache(lm, store, w.start)
        # the trackers group the windows under the sweep's folder name (an MLflow experiment; TensorBoard: the path)
        run = train(
            cfg.window_config(w), run_path, progress=step, records=sweep.records, base=lm, tracking_group=sweep_dir.name
        )
        del lm
        if not run.is_complete:  # cancelled: checkpoint kept, resume continues it
            return {"cancelled": w.name}
    row = _window_row(w, run, time.perf_counter() - t0, store, before)
    if cfg.n_generate:
        row.update(_generation_factuality(cfg, run, sweep.records))
    return row


def run_sweep(
    cfg: SweepConfig,
    sweep_dir: str | Path,
    progress: SweepProgress | None = None,
    base_loader: Callable[[], LoadedModel] | None = None,
    records=None,
    executor: ExecutorConfig | None = None,
):
    """Train and score every window of `cfg` not finished yet in `sweep_dir`; return the results table.

    Every window is a task (`train_window`) run by `executor` (default: the one saved with the sweep, else local:
    one after another in this process; ExecutorConfig(kind="ray") runs them as Ray tasks). This process alone writes
    results.jsonl and status.json, a row as each window ends. Resumable: a window with a row in results.jsonl is
    skipped; a window whose run directory is complete but has no row (a crash in between) gets its row without
    retraining; an interrupted window resumes from its last checkpoint (the trainer's resume). A stop request
    (foundations/status.py's request_stop; or progress returning False) stops after the current step with a checkpoint,
    state "cancelled". `base_loader` loads the base model (default: load_model of the config's model); each worker
    calls it once and every window trains a deep copy. A window that fails is reported (state "failed", its
    traceback in task-errors/<window>.log) after the others have run. One writer per sweep directory: a second
    run_sweep there while this one runs is refused."""
    with WriterLock(sweep_dir):
        return _run_sweep(cfg, Path(sweep_dir), progress, base_loader, records, executor)


def _run_sweep(cfg: SweepConfig, sweep_dir: Path, progress, base_loader, records, executor):
    import pandas as pd

    check_trackers(cfg.train)  # a tracker asked for but not installed fails before any window
    executor = executor or saved_executor(sweep_dir)
    save_sweep_config(sweep_dir, cfg, executor)
    clear_stop(sweep_dir)
    windows = cfg.window_list(layer_count(cfg.train.model))
    records = list(records) if records is not None else read_jsonl(cfg.train.data)
    results = sweep_dir / RESULTS_FILE
    done = {r["window"] for r in read_log_rows(results)} & {w.name for w in windows}
    todo = [w for w in windows if w.name not in done]
    total = len(windows)
    local = executor.kind == "local"
    cancelled: list[str] = []

    def status(current: str | None) -> None:
        write_status(sweep_dir, "running", done=len(done), total=total, current=current)

    def window_progress(ev: dict) -> bool | None:  # local: the window now training, then its steps
        if ev["event"] == "window":
            status(ev["window"])
        return None if progress is None else progress(ev)

    def on_done(w: Window, row: dict) -> bool:
        if "cancelled" in row:
            cancelled.append(w.name)
            return False
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        done.add(w.name)
        status(None if local else f"{len(todo) - len(done & {x.name for x in todo})} windows as Ray tasks")
        if progress is not None:
            progress({"event": "done", **row})
        return True

    status(None if local else f"{len(todo)} windows as Ray tasks")
    if progress is not None and todo:
        progress({"event": "plan", "todo": len(todo), "executor": executor.describe()})
    task = Study(cfg, sweep_dir, records, base_loader, window_progress if local else None)
    try:
        failures = run_tasks(train_window, task, todo, executor, on_done)
    except BaseException as e:
        state = "cancelled" if isinstance(e, KeyboardInterrupt) else "failed"
        write_status(sweep_dir, state, done=len(done), total=total, current=None, error=f"{type(e).__name__}: {e}")
        raise
    if failures:
        error = failure_report(sweep_dir, {f.item.name: f for f in failures})
        write_status(sweep_dir, "failed", done=len(done), total=total, current=None, error=error)
        raise RunError(error)
    state = "cancelled" if cancelled or (stop_requested(sweep_dir) and len(done) < total) else "finished"
    write_status(sweep_dir, state, done=len(done), total=total, current=None)
    return read_sweep(sweep_dir) if read_log_rows(results) else pd.DataFrame()


def resume_sweep(sweep_dir: str | Path, progress: SweepProgress | None = None, executor: ExecutorConfig | None = None):
    """Continue the sweep in `sweep_dir` with its saved config (and its saved executor unless one is given)."""
    path = Path(sweep_dir) / CONFIG_FILE
    if not path.exists():
        raise RunError(
            f"{sweep_dir}: no {CONFIG_FILE}; not a sweep directory (start one with python -m topl_core sweep)."
        )
    cfg = SweepConfig.from_json(json.loads(path.read_text())["config"])
    return run_sweep(cfg, sweep_dir, progress, executor=executor)
