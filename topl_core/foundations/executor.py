"""Where the independent tasks of a study run: one after another in this process (`local`), or as Ray tasks on a
Ray instance — started here, or a cluster's (`ray`, with an address; SLURM clusters start Ray with their own
scripts). A study (a layer sweep's windows, a label study's settings, an evaluation's variants) is one code path:
it builds its tasks and hands them to `run_tasks`; the local executor is the same tasks run serially.

Public API
    ExecutorConfig(kind="local"|"ray", address=None, cpus_per_task=1.0, gpus_per_task=0.0, max_retries=2)
    run_tasks(fn, shared, items, cfg, on_done) -> list[TaskFailure]
    failure_report(folder, {name: TaskFailure}) -> str   tracebacks to folder/task-errors/, the status's error
        fn(shared, item) -> dict, a module-level function (Ray pickles it by reference); `shared` is sent to the
        object store once, not once per task. on_done(item, result) runs here, in the driver, as each task ends (in
        the order they end): the study writes its results file there, so one process writes it. A task that
        raises is reported (TaskFailure with its traceback), the others go on; the caller says what failed.
    worker_memo(kind, key, make)     a value this process keeps between tasks (a base model, a prefix store): one
        per kind, replaced when the key changes; the local executor drops what its tasks kept when they are done.

Ray is an optional package (requirements-ray.txt, or the `ray` extra of pyproject.toml; scripts/setup.sh installs it
for the tests): nothing else needs it, and `--executor ray` without it is refused before any work, naming the install
command (RAY_INSTALL).

Contract for a task: it writes only its own folder (a run directory), takes that folder's WriterLock, and is
idempotent — a task that finds its work done returns its row without redoing it, and one that finds a checkpoint
resumes from it — so a retried or repeated task never redoes finished work. Ray retries a task whose worker died
(`max_retries`: out of memory, a node lost); a Python exception is not retried (training is deterministic, it
would fail again) but reported. On a cluster every node must see the study's folder (a shared file system) and
have topl_core installed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from .config_fields import config_argv, config_field
from .errors import ConfigError, ServiceError
from .services import check_reachable

ExecutorKind = Literal["local", "ray"]
RAY_GCS_PORT, RAY_CLIENT_PORT = 6379, 10001  # Ray's default ports: a head node's GCS, the Ray client (ray://)
RAY_FIX = (
    "Start the cluster (ray start --head on its head node), correct the address, or leave it empty to start Ray on "
    "this machine."
)
EXECUTORS: tuple[str, ...] = ("local", "ray")
RAY_INSTALL = "pip install -r requirements-ray.txt (or: pip install 'topl-workbench[ray]')"


def check_ray_installed() -> None:
    """Refuse --executor ray where Ray is not installed (an optional package), with the command that installs it."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a module entry of None (uninstalled in a test), or one without a spec
        found = False
    if not found:
        raise ConfigError(
            f"--executor ray needs Ray, an optional package that is not installed here: {RAY_INSTALL}. Or leave "
            "--executor local (the default): the same tasks one after another in this process."
        )


@dataclass(frozen=True)
class ExecutorConfig:
    """Where a study's tasks run and what each may use (Ray's resources: a task waits until they are free)."""

    kind: ExecutorKind = config_field(
        "local",
        label="Run the tasks",
        help="local: one task after another in this process; ray: as Ray tasks, each in its own worker process, on a "
        "Ray instance started here or on a cluster (its address)",
        flag="--executor",
    )
    address: str | None = config_field(
        None,
        label="Ray address",
        help="ray: join this Ray cluster ('auto', host:port) instead of starting one on this machine",
        flag="--ray-address",
    )
    cpus_per_task: float = config_field(
        1.0,
        label="CPUs per task",
        help="ray: CPUs each task holds (its torch threads; a local task uses the whole process)",
        min=0.1,
        max=1024.0,
        flag="--task-cpus",
    )
    gpus_per_task: float = config_field(
        0.0,
        label="GPUs per task",
        help="ray: GPUs each task holds (fractions share a GPU)",
        min=0.0,
        max=64.0,
        flag="--task-gpus",
    )
    max_retries: int = config_field(
        2,
        label="Retries (worker died)",
        help="ray: times a task whose worker process died is started again",
        min=0,
        max=100,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", self.address or None)  # a form's empty field: start one here
        if self.kind not in EXECUTORS:
            raise ConfigError(f"executor {self.kind!r}: choose one of {', '.join(EXECUTORS)}.")
        if self.cpus_per_task <= 0 or self.gpus_per_task < 0 or self.max_retries < 0:
            raise ConfigError(
                f"executor resources cpus_per_task={self.cpus_per_task}, gpus_per_task={self.gpus_per_task}, "
                f"max_retries={self.max_retries}: CPUs must be > 0, GPUs and retries ≥ 0."
            )
        if self.kind == "local" and self.address:
            raise ConfigError(f"--ray-address {self.address!r} needs --executor ray.")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> "ExecutorConfig":
        return cls(**(d or {}))

    def cli_args(self) -> list[str]:
        """The command-line flags that ask for this executor (topl_core.cli.common.add_executor_args); --executor
        always, since a command without it keeps the study's saved executor."""
        return config_argv(self, always=("kind",))

    def check_reachable(self) -> None:
        """Refuse, before any task, Ray where it is not installed, and a cluster address where nothing answers (Ray's
        own connect retries for minutes). "auto" (a cluster this machine runs, found by Ray) and no address (Ray
        started here) are not probed."""
        if self.kind == "ray":
            check_ray_installed()
        if self.kind == "ray" and self.address not in (None, "auto", "local"):
            client = self.address.startswith("ray://")
            check_reachable(
                self.address,
                RAY_CLIENT_PORT if client else RAY_GCS_PORT,
                what="the Ray cluster's " + ("client server" if client else "head node"),
                setting="--ray-address",
                fix=RAY_FIX,
            )

    def describe(self) -> str:
        if self.kind == "local":
            return "in this process, one task after another"
        where = f"the Ray cluster at {self.address}" if self.address else "a Ray instance on this machine"
        gpus = f", {self.gpus_per_task:g} GPU" if self.gpus_per_task else ""
        return f"as Ray tasks on {where} ({self.cpus_per_task:g} CPU{gpus} each)"


@dataclass(frozen=True)
class TaskFailure:
    item: Any
    error: str  # "ValueError: …"
    traceback: str


def failure_report(folder: str | Path | None, failures: dict[str, TaskFailure]) -> str:
    """Write each failed task's traceback to folder/task-errors/<name>.log; the error for the study's status,
    naming the tasks, their errors and where the logs are (without a folder: the tracebacks themselves)."""
    listed = "; ".join(f"{name}: {f.error}" for name, f in failures.items())
    if folder is None:
        return f"{len(failures)} task(s) failed ({listed}).\n\n" + "\n".join(f.traceback for f in failures.values())
    logs = Path(folder) / "task-errors"
    logs.mkdir(parents=True, exist_ok=True)
    for name, f in failures.items():
        (logs / f"{name}.log").write_text(f"{f.error}\n\n{f.traceback}", encoding="utf-8")
    return f"{len(failures)} task(s) failed ({listed}); tracebacks in {logs}. Resume to retry them."


# --- state a worker keeps between tasks -------------------------------------------------------------------------

_MEMO: dict[str, tuple[Any, Any]] = {}


def worker_memo(kind: str, key: Any, make: Callable[[], Any]) -> Any:
    """This process's value of `kind` for `key`, made once (a new key replaces the old value, so a worker that
    moves on to another study does not keep the last one's model)."""
    held = _MEMO.get(kind)
    if held is None or held[0] != key:
        _MEMO.pop(kind, None)  # drop the old value before making the new one: two base models need not fit
        _MEMO[kind] = (key, make())
    return _MEMO[kind][1]


# --- running ----------------------------------------------------------------------------------------------------


def run_tasks(
    fn: Callable[[Any, Any], dict],
    shared: Any,
    items: Sequence[Any],
    cfg: ExecutorConfig,
    on_done: Callable[[Any, dict], "bool | None"],
) -> list[TaskFailure]:
    """Run fn(shared, item) for every item (see the module docstring). `on_done` returning False ends a local run
    before its next task (a cancelled study); Ray's tasks already submitted see the study's own stop request."""
    if not items:
        return []
    if cfg.kind == "local":
        return _run_local(fn, shared, items, on_done)
    return _run_ray(fn, shared, items, cfg, on_done)


def _run_local(fn, shared, items, on_done) -> list[TaskFailure]:
    failures = []
    outer = dict(_MEMO)  # a study run inside another's task (an evaluation in a window) keeps the outer one's
    try:
        for item in items:
            try:
                result = fn(shared, item)
            except Exception as e:  # reported like a Ray task's; KeyboardInterrupt (Ctrl-C, SIGTERM) ends the run
                failures.append(TaskFailure(item, f"{type(e).__name__}: {e}", traceback.format_exc()))
                continue
            if on_done(item, result) is False:
                break
    finally:  # this process is no worker: what the tasks kept is dropped with them
        _MEMO.clear()
        _MEMO.update(outer)
    return failures


def _ray_task(fn, shared, item, threads: int):
    import torch

    torch.set_num_threads(threads)  # the CPUs this task holds, not every core of the node
    return fn(shared, item)


def _run_ray(fn, shared, items, cfg: ExecutorConfig, on_done) -> list[TaskFailure]:
    cfg.check_reachable()  # Ray installed, the cluster answering
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from this machine
    started_here = not ray.is_initialized()
    if started_here:
        on_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=cfg.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except ConnectionError as e:  # something answers at the address, but not a Ray cluster (or it went away)
            raise ServiceError(f"--ray-address {cfg.address}: {str(e).splitlines()[0]}. {RAY_FIX}") from e
        if on_sigterm is not None and threading.current_thread() is threading.main_thread():
            # Ray installs a handler that ends the process without unwinding; keep ours (a job's SIGTERM is a
            # clean stop: status.sigterm_as_interrupt), so the study still writes its state
            signal.signal(signal.SIGTERM, on_sigterm)
    try:
        remote = ray.remote(_ray_task).options(
            num_cpus=cfg.cpus_per_task,
            num_gpus=cfg.gpus_per_task,
            max_retries=cfg.max_retries,
            retry_exceptions=False,
        )
        shared_ref = ray.put(shared)
        threads = max(1, int(cfg.cpus_per_task))
        pending = {remote.remote(fn, shared_ref, item, threads): item for item in items}
        failures = []
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            item = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except Exception as e:  # RayTaskError carries the task's traceback; WorkerCrashedError after retries
                cause = getattr(e, "cause", None) or e
                failures.append(TaskFailure(item, f"{type(cause).__name__}: {cause}", str(e)))
                continue
            on_done(item, result)
        return failures
    finally:
        if started_here:
            ray.shutdown()
