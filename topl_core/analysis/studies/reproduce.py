"""The paper's tables in one study: every training method trained on the same data and split with the paper's relative
settings (method_runs.py), then measured on the same held-out tokens and documents by the workbench's own studies —
LoRA-A separability with its random-init-A control (lora_a/probe.py), the factuality of the base and every merged
model, ID and OOD (evaluation/evaluate.py), the λ curves with their controls and fluency (evaluation/lambda_study.py),
label sensitivity (label_sensitivity.py) and token-level detection (transfer.py) — and a report setting each table
beside the paper's, with a verdict per claim (reproduce_report.py).

    ReproduceConfig (reproduce_config.py; .quick() for the suite)
    plan_tasks(cfg) -> [Task]      phase 1: train-<method>, labels, factuality-base; phase 2 (after the trainings):
                                   separability-, factuality-, lambda-, detection-<method>
    run_reproduce(cfg, folder, progress=None, executor=None) -> Path | None   report.md, None when stopped early
    resume_reproduce(folder, progress=None, executor=None)     with the folder's saved config
    read_tasks(folder) -> DataFrame      every task: phase, state (done / to do), seconds
    read_results(folder) -> {task name: result}

Every task is independent within its phase and runs where the executor says (in this process, or as Ray tasks:
topl_core.foundations.executor); this process alone writes the study's files. A finished task's result is
tasks/<name>.json, written once: a rerun finds it and never runs that task again; a training stopped part-way resumes
from its checkpoint; the measures' generations, projections and token scores are cached (analysis/cache.py), so a
measure stopped part-way keeps what it had. A stop request (status.request_stop; the page's Stop) ends the study
after the current training step or task, state "cancelled".

Layout of a study folder:
    reproduce.json      {"config": ReproduceConfig, "executor": ExecutorConfig}
    status.json, STOP   state, done / total tasks, the current task, eta_s; a stop request (foundations/status.py)
    methods/<method>/   each method's run directory
    labels/             the label study (label_study.json, a run per setting)
    tasks/<name>.json   a finished task's result; tasks-errors/ the tracebacks of failed ones
    report.md, report.html (self-contained), report.json, figures/*.svg
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from ...data.records import read_jsonl
from ...data.split import split_records
from ...foundations.errors import RunError
from ...foundations.executor import ExecutorConfig, failure_report, run_tasks
from ...foundations.io import write_json
from ...foundations.paths import project_path
from ...foundations.status import WriterLock, clear_stop, stop_requested, write_status
from ...hardware.machine import machine_description
from ...training.methods import METHODS
from ...training.run_dirs import RunDir
from ...training.trainer import train
from ..evaluation.config import Variant
from ..evaluation.evaluate import evaluate
from ..evaluation.lambda_study import lambda_sweep
from ..lora_a.probe import ProbeSettings, labelled_records, probe_run
from .label_sensitivity import LabelStudyConfig, run_label_study
from .method_runs import training_summary
from .reproduce_config import ReproduceConfig
from .reproduce_report import write_report
from .study import Study
from .transfer import TransferSettings, transfer_table

CONFIG_FILE, TASKS_DIR = "reproduce.json", "tasks"


def method_run(folder: Path, method: str) -> Path:
    return folder / "methods" / method


# --- the tasks ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One independent piece of the study (its `kind`, for a method or for the study as a whole): `run` does it and
    returns its result, which the driver writes to tasks/<name>.json."""

    method: str | None = None
    kind: ClassVar[str] = ""
    phase: ClassVar[int] = 2  # after the trainings, which it reads

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.method}" if self.method else self.kind

    def run(self, study: Study[ReproduceConfig]) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class TrainMethod(Task):
    kind: ClassVar[str] = "train"
    phase: ClassVar[int] = 1

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg.train_config(self.method)
        run = RunDir(method_run(study.folder, self.method))
        if not run.is_complete:  # a stopped run resumes from its checkpoint (the trainer's resume)
            run = train(cfg, run.path, progress=lambda _: not stop_requested(study.folder), records=study.records)
            if not run.is_complete:
                return {"cancelled": self.name}
        return {"summary": training_summary(run), "config": cfg.to_json()}


@dataclass(frozen=True)
class LabelSensitivity(Task):
    """TOPL on every label setting: the label study itself (its own folder, resumable setting by setting)."""

    kind: ClassVar[str] = "labels"
    phase: ClassVar[int] = 1

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg
        label_cfg = LabelStudyConfig(
            train=cfg.train_config("topl", steps=cfg.label_steps),
            settings=cfg.label_settings,
            n_cliff=cfg.label_cliff_records,
            cliff_csv=cfg.cliff_csv,
        )
        table = run_label_study(label_cfg, study.folder / "labels", records=study.records)
        return {"rows": table.drop(columns=["run"]).to_dict("records")}


@dataclass(frozen=True)
class Factuality(Task):
    """The base model's (method None) or a merged model's summaries of the ID and OOD documents, both protocols."""

    kind: ClassVar[str] = "factuality"

    @property
    def phase(self) -> int:  # the base model waits for no training
        return 1 if self.method is None else 2

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.method or 'base'}"

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg.eval_config()
        variant = (
            Variant.base(study.cfg.model)
            if self.method is None
            else Variant.merged(method_run(study.folder, self.method), name=self.method)
        )
        per_doc = evaluate([variant], cfg, measure_quality=False).per_doc
        return {"rows": per_doc.drop(columns=["run"]).to_dict("records")}


@dataclass(frozen=True)
class Separability(Task):
    """The method's LoRA-A per site on the study's token set, with the random-init-A control on the same inputs."""

    kind: ClassVar[str] = "separability"

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg
        records = token_set(study.records, cfg)
        settings = ProbeSettings(precision=cfg.precision, random_control=True, seed=cfg.seed)
        result = probe_run(method_run(study.folder, self.method), records, settings, token_set="test split")
        return {"probe": result.to_json(), "records": len(records)}


@dataclass(frozen=True)
class LambdaCurve(Task):
    """The method's LoRA-B vector and its controls steered over their λ grids on the evaluation's documents."""

    kind: ClassVar[str] = "lambda"

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg
        grids = cfg.lambda_grids()
        rows = lambda_sweep(
            str(method_run(study.folder, self.method)),
            cfg.lambdas,
            cfg.eval_config(),
            sets=("ID", "OOD"),
            modes=tuple(grids),
            grids=grids,
        )
        return {"rows": rows.assign(run=self.method).to_dict("records")}  # the curves' run key: the method


@dataclass(frozen=True)
class Detection(Task):
    """The method's head against surprisal and the frozen probe on the held-out token sets (test split, CLIFF's
    test cut), logged as a held-out evaluation."""

    kind: ClassVar[str] = "detection"

    def run(self, study: Study[ReproduceConfig]) -> dict:
        cfg = study.cfg
        settings = TransferSettings(
            stage="heldout",
            max_records_per_set=cfg.detection_records,
            probe_records=cfg.detection_probe_records,
            precision=cfg.precision,
            seed=cfg.seed,
        )
        tokens: dict = {}  # CLIFF's labelled tokens with the head's score: two methods' heads paired on them
        run = method_run(study.folder, self.method)
        table = transfer_table([run], settings, cfg.cliff_csv, study.records, heads=tokens)
        heads = {
            name: {k: np.round(v, 6).tolist() for k, v in arrays.items()}
            for (_, name), arrays in tokens.items()
            if name.startswith("cliff-")
        }
        rows = table.assign(adapter=self.method).to_dict("records")
        return {"rows": rows, "notes": table.attrs["notes"], "heads": heads}


def token_set(records, cfg: ReproduceConfig) -> list:
    """The labelled records of the test split every adapter's LoRA-A is probed on (the first probe_records)."""
    return labelled_records(split_records(records, seed=cfg.split_seed)["test"])[: cfg.probe_records]


def plan_tasks(cfg: ReproduceConfig) -> list[Task]:
    """Every task of the study, in the order a serial run takes them."""
    heads = [m for m in cfg.methods if METHODS[m].uses_head]
    steered = [m for m in cfg.methods if m in cfg.lambda_methods]
    return [
        *(TrainMethod(m) for m in cfg.methods),
        Factuality(None),
        *([LabelSensitivity()] if "topl" in cfg.methods else []),
        *(t for m in cfg.methods for t in (Separability(m), Factuality(m))),
        *(LambdaCurve(m) for m in steered),
        *(Detection(m) for m in heads),
    ]


def run_task(study: Study[ReproduceConfig], task: Task) -> dict:
    """A task as the executor runs it: its result with its wall time, or {"cancelled": name} when stopped."""
    if stop_requested(study.folder):
        return {"cancelled": task.name}
    if study.progress is not None:
        study.progress(task.name)
    t0 = time.perf_counter()
    result = task.run(study)
    return result if "cancelled" in result else {**result, "task": task.name, "seconds": time.perf_counter() - t0}


# --- the study ----------------------------------------------------------------------------------------------------


def save_config(folder: Path, cfg: ReproduceConfig, executor: ExecutorConfig) -> None:
    """Write the study's config (and executor: not part of what it computes, so a resume may change it), refusing a
    folder that holds a study with other settings."""
    path = folder / CONFIG_FILE
    if path.exists():
        old = ReproduceConfig.from_json(json.loads(path.read_text())["config"])
        if old != cfg:
            raise RunError(
                f"{folder} holds a reproduction with other settings ({'; '.join(cfg.differences(old))}); resume it "
                f"with its own (python -m topl_core reproduce --resume {folder}) or use another --out."
            )
    write_json(path, {"config": cfg.to_json(), "executor": executor.to_json()})


def saved(folder: str | Path) -> tuple[ReproduceConfig, ExecutorConfig]:
    """The config and executor of the study in `folder`."""
    path = Path(folder) / CONFIG_FILE
    if not path.exists():
        raise RunError(
            f"{folder}: no {CONFIG_FILE}; not a reproduction (start one with python -m topl_core reproduce)."
        )
    d = json.loads(path.read_text())
    return ReproduceConfig.from_json(d["config"]), ExecutorConfig.from_json(d.get("executor"))


def study_executor(folder: str | Path) -> ExecutorConfig:
    """Where the study in `folder` last ran its tasks (local when none has run there)."""
    return saved(folder)[1] if (Path(folder) / CONFIG_FILE).exists() else ExecutorConfig()


def task_file(folder: Path, task: Task) -> Path:
    return folder / TASKS_DIR / f"{task.name}.json"


def run_reproduce(
    cfg: ReproduceConfig,
    folder: str | Path,
    progress: Callable[[str], None] | None = None,
    executor: ExecutorConfig | None = None,
) -> Path | None:
    """Run every task of `cfg` not finished yet in `folder` (module docstring), then write the report; its path, or
    None when the study stopped before the end (a stop request). One writer per folder."""
    folder = Path(folder)
    with WriterLock(folder):
        return _run(cfg, folder, progress, executor)


def resume_reproduce(folder: str | Path, progress=None, executor: ExecutorConfig | None = None) -> Path | None:
    """Continue the study in `folder` with its saved config (and saved executor, unless one is given)."""
    return run_reproduce(saved(folder)[0], folder, progress, executor)


def _run(cfg: ReproduceConfig, folder: Path, progress, executor: ExecutorConfig | None) -> Path | None:
    executor = executor or study_executor(folder)
    save_config(folder, cfg, executor)
    clear_stop(folder)
    tasks = plan_tasks(cfg)
    results = {t.name: _read(task_file(folder, t)) for t in tasks if task_file(folder, t).exists()}
    seconds = {t: r["seconds"] for t, r in results.items()}
    kinds = {t.name: t.kind for t in tasks}
    cancelled: list[str] = []
    local = executor.kind == "local"

    def status(state: str = "running", current: str | None = None, **extra) -> None:
        todo = [t for t in tasks if t.name not in seconds]
        write_status(
            folder, state, done=len(seconds), total=len(tasks), current=current, eta_s=_eta(todo, seconds, kinds),
            **extra,
        )  # fmt: skip

    def started(name: str) -> None:  # local: the task now running
        status(current=name)
        if progress is not None:
            progress(name)

    def on_done(task: Task, result: dict) -> bool:
        if "cancelled" in result:
            cancelled.append(task.name)
            return False
        write_json(task_file(folder, task), result)
        seconds[task.name] = result["seconds"]
        status(current=None if local else f"{sum(t.name not in seconds for t in tasks)} tasks as Ray tasks")
        return not stop_requested(folder)

    study = Study(cfg, folder, read_jsonl(project_path(cfg.data)), None, started if local else None)
    status()
    try:
        for phase in (1, 2):
            todo = [t for t in tasks if t.phase == phase and t.name not in seconds]
            if cancelled or stop_requested(folder):
                break
            failures = run_tasks(run_task, study, todo, executor, on_done)
            if failures:
                raise RunError(failure_report(folder, {f.item.name: f for f in failures}))
    except BaseException as e:
        status("cancelled" if isinstance(e, KeyboardInterrupt) else "failed", error=f"{type(e).__name__}: {e}")
        raise
    if len(seconds) < len(tasks):
        status("cancelled")
        return None
    report = write_report(folder, cfg, read_results(folder), machine_description(cfg.device))
    status("finished")
    return report


def _eta(todo: list[Task], seconds: dict[str, float], kinds: dict[str, str]) -> float | None:
    """Seconds left, one task after another: each task to do at the mean time of the finished tasks of its kind
    (of every finished task for a kind none of which has finished); None before any task has finished."""
    if not seconds:
        return None if todo else 0.0
    by_kind: dict[str, list[float]] = {}
    for name, s in seconds.items():
        by_kind.setdefault(kinds.get(name, ""), []).append(s)
    overall = statistics.mean(seconds.values())
    return sum(statistics.mean(by_kind[t.kind]) if t.kind in by_kind else overall for t in todo)


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def read_results(folder: str | Path) -> dict[str, dict]:
    """The results of the study's finished tasks, by task name."""
    folder = Path(folder)
    return {p.stem: _read(p) for p in sorted((folder / TASKS_DIR).glob("*.json"))}


def read_tasks(folder: str | Path):
    """One row per task of the study in `folder`: name, kind, method, phase, state ("done" / "to do"), seconds."""
    import pandas as pd

    folder = Path(folder)
    cfg, _ = saved(folder)
    rows = []
    for t in plan_tasks(cfg):
        path = task_file(folder, t)
        seconds = _read(path)["seconds"] if path.exists() else None
        rows.append(
            {"task": t.name, "kind": t.kind, "method": t.method or "", "phase": t.phase, "seconds": seconds}
            | {"state": "done" if path.exists() else "to do"}
        )
    return pd.DataFrame(rows)
