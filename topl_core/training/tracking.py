"""Experiment trackers: every row a run writes to metrics.jsonl, and its config, also where researchers keep their
runs (TrainConfig.report_to, as TRL's `report_to`). Optional packages: `pip install -e '.[tracking]'`.

    check_trackers(cfg)                                  before any work: a clear error naming what to install,
                                                         or the MLflow server or database that does not answer
    open_trackers(cfg, run, start, group) -> Trackers    rank 0 only; one Tracker per name in cfg.report_to
    trackers.log(row) / trackers.close(state)            a metrics.jsonl row; the run's end state

A tracker that fails mid-run never stops training: the failure is warned (the run's log) and recorded in the run's
status (the Runs page shows it), later rows are no longer sent to that tracker, and metrics.jsonl keeps every row.

TensorBoard: event files in the run folder itself, so `tensorboard --logdir runs/` lists every run (a sweep's windows
under the sweep's folder); the config as HParams. A resumed run purges the events after its checkpoint, as
metrics.jsonl drops its rows. MLflow: `cfg.mlflow_tracking_uri`, by default the SQLite store `mlflow.db` in the runs
folder (`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`; MLflow's plain-file store is in maintenance mode);
experiment = the group (a sweep's or label study's folder name, else "topl-workbench"), run name = the run folder's
name, the config as params; a resumed run logs into its MLflow run again (found by the run folder's path).
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from typing import Protocol
from urllib.parse import urlsplit

from ..foundations.config_fields import flat_fields, value_of
from ..foundations.errors import ConfigError
from ..foundations.paths import runs_dir
from ..foundations.services import check_reachable
from ..foundations.status import add_warning
from .config import TrainConfig
from .run_dirs import RunDir

DEFAULT_EXPERIMENT = "topl-workbench"
INSTALL = "pip install -e '.[tracking]'"
RUN_DIR_TAG = "topl.run_dir"  # the MLflow tag that finds a run folder's MLflow run again on resume


def default_mlflow_uri() -> str:
    """MLflow's store when the config names none: mlflow.db in the runs folder (TOPL_RUNS_DIR)."""
    return f"sqlite:///{(runs_dir() / 'mlflow.db').resolve()}"


def mlflow_uri(cfg: TrainConfig) -> str:
    return cfg.mlflow_tracking_uri or default_mlflow_uri()


def _modules_needed(cfg: TrainConfig) -> dict[str, list[str]]:
    """tracker → the modules it imports (MLflow's SQLite store needs SQLAlchemy and Alembic beside mlflow-skinny)."""
    sqlite = mlflow_uri(cfg).startswith("sqlite:")
    needed = {"tensorboard": ["tensorboard"], "mlflow": ["mlflow"] + (["sqlalchemy", "alembic"] if sqlite else [])}
    return {name: needed[name] for name in cfg.report_to}


# MLflow stores reached over the network (a tracking server, a database) by URI scheme, with the scheme's default
# port; a SQLite or file store is on this machine and needs no probe
MLFLOW_REMOTE_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}


def check_trackers(cfg: TrainConfig) -> None:
    """Refuse, before any work starts, a tracker whose package is not installed (naming the install command) or
    whose server does not answer (TensorBoard writes files into the run folder: nothing to reach)."""
    missing = {
        name: [m for m in mods if importlib.util.find_spec(m) is None] for name, mods in _modules_needed(cfg).items()
    }
    missing = {name: mods for name, mods in missing.items() if mods}
    if missing:
        what = "; ".join(f"{name} needs {', '.join(mods)}" for name, mods in missing.items())
        raise ConfigError(
            f"report_to={list(cfg.report_to)}: {what}, not installed. Install the trackers with {INSTALL} "
            f"(tensorboard, mlflow-skinny, sqlalchemy, alembic), or drop them from report_to."
        )
    uri = mlflow_uri(cfg)
    port = MLFLOW_REMOTE_PORTS.get(urlsplit(uri).scheme.split("+")[0])  # postgresql+psycopg2: postgresql
    if "mlflow" in cfg.report_to and port is not None:
        check_reachable(
            uri,
            port,
            what="MLflow's tracking store",
            setting="mlflow_tracking_uri (--mlflow-tracking-uri)",
            fix="Start the MLflow server there (mlflow server --host HOST --port PORT), correct the URI (empty: the "
            "SQLite store in the runs folder), or drop mlflow from report_to (--report-to).",
        )


def hyperparameters(cfg: TrainConfig) -> dict[str, str | int | float | bool]:
    """The config flat, keyed as the train command's flags are (lora_r, ...), lists as space-separated text."""
    out = {}
    for s in flat_fields(TrainConfig):
        value = value_of(cfg, s)
        out[s.key] = " ".join(map(str, value)) if isinstance(value, tuple) else value
    return out


def numeric_metrics(row: dict) -> dict[str, float]:
    """What a tracker records of a metrics.jsonl row: every number but the step itself."""
    return {
        k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, state: str) -> None: ...


class TensorBoardTracker:
    def __init__(self, cfg: TrainConfig, run: RunDir, start: int):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: events of steps after the checkpoint (logged before a resume) are dropped, as in metrics.jsonl
        self.writer = SummaryWriter(log_dir=str(run.path), purge_step=start + 1 if start else None)
        if not start:  # the HParams tab's entry, in this run's own event file (not a sub-run as add_hparams makes)
            for summary in hparams(hyperparameters(cfg), {}):
                self.writer.file_writer.add_summary(summary)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a live dashboard sees each step as it is written

    def close(self, state: str) -> None:
        self.writer.close()


MLFLOW_STATUS = {"finished": "FINISHED", "cancelled": "KILLED", "failed": "FAILED"}


class MLflowTracker:
    def __init__(self, cfg: TrainConfig, run: RunDir, start: int, group: str):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(cfg))
        experiment = self.client.get_experiment_by_name(group)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(group)
        where = str(run.path.resolve())
        quote = "'" if "'" not in where else '"'  # MLflow's filter strings take either quote and no escapes
        earlier = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = {quote}{where}{quote}", max_results=1
        )
        if start and earlier:  # a resumed run goes on in its MLflow run
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        created = self.client.create_run(experiment_id, run_name=run.name, tags={RUN_DIR_TAG: where})
        self.run_id = created.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in hyperparameters(cfg).items()])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, state: str) -> None:
        self.client.set_terminated(self.run_id, status=MLFLOW_STATUS.get(state, "FAILED"))


class Trackers:
    """The run's trackers together (none: every call does nothing). A tracker whose call raises is reported
    (module docstring) and dropped; the run goes on."""

    def __init__(self, trackers: dict[str, Tracker] | None = None, run: RunDir | None = None):
        self.trackers = dict(trackers or {})
        self.run = run

    def log(self, row: dict) -> None:
        if self.trackers:
            metrics = numeric_metrics(row)
            for name, t in list(self.trackers.items()):
                try:
                    t.log(row["step"], metrics)
                except Exception as e:
                    del self.trackers[name]  # a broken tracker is not closed: MLflow would retry for minutes
                    self._failed(name, f"failed at step {row['step']}", e, "training went on without it; ")

    def close(self, state: str) -> None:
        for name, t in self.trackers.items():
            try:
                t.close(state)
            except Exception as e:
                self._failed(name, f"failed to record the run's end ({state})", e, "")
        self.trackers = {}

    def _failed(self, name: str, what: str, error: Exception, went_on: str) -> None:
        first = str(error).strip().splitlines()[0][:300] if str(error).strip() else "no message"
        message = f"the {name} tracker {what} ({type(error).__name__}: {first}); {went_on}metrics.jsonl has every row."
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        if self.run is not None:
            add_warning(self.run.path, message)


def open_trackers(cfg: TrainConfig, run: RunDir, start: int, group: str | None = None) -> Trackers:
    """One tracker per name in cfg.report_to for the run that continues after step `start` (0: a new run)."""
    check_trackers(cfg)
    made: dict[str, Tracker] = {}
    for name in cfg.report_to:
        if name == "tensorboard":
            made[name] = TensorBoardTracker(cfg, run, start)
        else:
            made[name] = MLflowTracker(cfg, run, start, group or DEFAULT_EXPERIMENT)
    return Trackers(made, run)
