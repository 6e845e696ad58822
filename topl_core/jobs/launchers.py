"""Typed job launchers: each kind of long work started in the background from its config, never from a command
line a page writes (the command line is built here, in one place per kind, and read back by the CLI's own parser).

    launch_train(TrainConfig, run_dir) / resume_train(run_dir)
    launch_sweep(SweepConfig, sweep_dir, executor) / resume_sweep_job(sweep_dir)
    launch_evaluation(EvalJob, out_dir) / launch_translation(TranslationJob, out_dir)
    launch_data_build(DataSource, SourceOptions, out, job_dir) / read_data_build(job_dir)
    launch_reproduce(ReproduceConfig, folder, executor) / resume_reproduce_job(folder)
    launch_deck(DeckConfig, folder) / resume_deck_job(folder)

State, stop and the job list: topl_core.jobs.background (read_job, cancel, list_jobs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..analysis.evaluation.config import EvalJob
from ..analysis.evaluation.translation import TranslationJob
from ..analysis.studies.deck import DeckConfig, create_deck, read_deck
from ..analysis.studies.reproduce import save_config, study_executor
from ..analysis.studies.reproduce_config import ReproduceConfig
from ..analysis.studies.sweeps import SweepConfig, save_sweep_config, saved_executor
from ..data.sources import DataSource, SourceOptions
from ..foundations.config_fields import config_argv
from ..foundations.errors import JobError
from ..foundations.executor import ExecutorConfig
from ..foundations.paths import runs_dir
from ..foundations.progress import bar_count
from ..runtime.modes import MODE_SETTINGS, SteerConfig
from ..training.config import TrainConfig
from ..training.run_dirs import RunDir
from ..training.tracking import check_trackers
from .background import JobStatus, claim, job_info, launch, log_tail, read_job, start_claimed


def evaluation_argv(job: EvalJob, out_dir: str | Path) -> list[str]:
    """The `evaluate` command line of a job, writing eval.json and per_doc.csv into out_dir."""
    cfg, out = job.cfg, Path(out_dir)
    argv = ["evaluate", *config_argv(cfg, skip={"model"}), "--json", str(out / "eval.json")]
    argv += ["--csv", str(out / "per_doc.csv")]
    for r in job.runs:
        argv += ["--run", str(r)]
    if not job.runs:  # with adapters, each is evaluated on its own base model
        argv += ["--model", cfg.model]
    if job.study is not None:
        st = job.study
        argv += ["--lambdas", *map(str, st.lambdas), "--modes", *st.modes, "--positions", st.positions]
        argv += ["--sets", *st.sets, *config_argv(SteerConfig(**dict(st.settings)), only=MODE_SETTINGS)]
        if st.scaled_lambdas:
            argv += ["--scaled-lambdas", *map(str, st.scaled_lambdas)]
        return argv
    if job.steer:
        argv += ["--steer", *map(str, job.steer)]
    if not job.include_base:
        argv += ["--no-base"]
    return argv


def launch_evaluation(job: EvalJob, out_dir: str | Path) -> Path:
    """Start an evaluation (a results table or a λ study) in the background, writing into out_dir."""
    return launch(evaluation_argv(job, out_dir), out_dir, kind="evaluate")


def translation_argv(job: TranslationJob, out_dir: str | Path) -> list[str]:
    """The `evaluate-mt` command line of a job, writing eval.json and per_doc.csv into out_dir."""
    cfg, out = job.cfg, Path(out_dir)
    argv = ["evaluate-mt", *config_argv(cfg, skip={"model"}), "--n-id", str(job.n_id), "--n-ood", str(job.n_ood)]
    argv += ["--split", job.split]
    argv += ["--json", str(out / "eval.json"), "--csv", str(out / "per_doc.csv")]
    for flag, value in (("--mlqe", job.mlqe), ("--flores", job.flores), ("--ood-src", job.ood_src)):
        if value:
            argv += [flag, value]
    if job.ood_ref:
        argv += ["--ood-ref", job.ood_ref]
    for r in job.runs:
        argv += ["--run", str(r)]
    if not job.runs:
        argv += ["--model", cfg.model]
    if not job.include_base:
        argv += ["--no-base"]
    return argv


def launch_translation(job: TranslationJob, out_dir: str | Path) -> Path:
    """Start a translation evaluation in the background, writing into out_dir."""
    return launch(translation_argv(job, out_dir), out_dir, kind="evaluate")


def data_build_argv(source: DataSource, options: SourceOptions, out: str | Path) -> list[str]:
    """The `data build` command line of `source` with `options` (every option it reads spelled, so that none falls
    back to another default), writing `out`."""
    argv = ["data", "build", "--source", source.name, *config_argv(options, only=source.options, always=source.options)]
    return [*argv, "--out", str(out)]


def launch_data_build(source: DataSource, options: SourceOptions, out: str | Path, job_dir: str | Path) -> Path:
    """Build `source` into `out` in the background (a source a model writes: minutes to hours), logging into
    job_dir; read it back with read_data_build."""
    info = {"source": source.name, "out": str(out), "limit": options.limit}
    return launch(data_build_argv(source, options, out), job_dir, kind="data", info=info)


@dataclass(frozen=True)
class DataBuild:
    """A background `data build`: its job, the file it writes, its progress and, once ended, what it said."""

    job: JobStatus
    source: str
    out: Path
    done: int
    total: int  # the limit until the first progress line
    said: tuple[str, ...]  # the lines after its last progress line: the source's report and "wrote N records to …"


def read_data_build(job_dir: str | Path) -> DataBuild | None:
    """The data build in job_dir, None where there is none (or one whose launcher stored no info)."""
    job, info = read_job(job_dir), job_info(job_dir)
    if job is None or "out" not in info:
        return None
    lines = log_tail(job_dir, 40).splitlines()
    counted = [i for i, line in enumerate(lines) if bar_count(line)]
    done, total = bar_count(lines[counted[-1]]) if counted else (0, int(info["limit"]))
    said = tuple(line for line in lines[counted[-1] + 1 :] if line.strip()) if counted else ()
    return DataBuild(job, info.get("source", ""), Path(info["out"]), done, total, said)


def launch_train(cfg: TrainConfig, run_dir: str | Path | None = None, env: dict | None = None) -> Path:
    """Start training `cfg` in the background into run_dir (default runs/<method>-<model>-<time>)."""
    check_trackers(cfg)  # said here, on the page, rather than in a background job's log
    if run_dir is None:
        run_dir = runs_dir() / default_run_name(cfg)
    run = RunDir(Path(run_dir).resolve())
    with claim(run.path) as lock:  # checked and written under the lock: a twin launch cannot overwrite the config
        if run.config_path.exists():
            old, _ = run.read_config()
            if old != cfg:
                raise JobError(f"{run.path} already holds a different run; choose another run name.")
            if run.is_complete:
                raise JobError(f"{run.path} is already finished; choose another run name.")
        elif run.is_foreign:
            raise JobError(f"{run.path} exists and is not a run directory; choose another run name.")
        else:
            run.write_config(
                cfg, {"launched_by": "topl_core.jobs.background"}
            )  # the trainer reads it back with --resume
        return start_claimed(["train", "--resume", str(run.path)], lock, "train", env)


def resume_train(run_dir: str | Path, env: dict | None = None) -> Path:
    """Continue a cancelled/failed/interrupted run from its last checkpoint, in the background."""
    run = RunDir(Path(run_dir).resolve())
    if not run.config_path.exists():
        raise JobError(f"{run.path} is not a run directory (no topl_config.json).")
    if run.is_complete:
        raise JobError(f"{run.path} is already finished.")
    return launch(["train", "--resume", str(run.path)], run.path, kind="train", env=env)


def launch_sweep(cfg: SweepConfig, sweep_dir: str | Path, executor: ExecutorConfig | None = None) -> Path:
    """Start (or continue) a layer sweep in the background, its windows run by `executor` (default: the sweep's
    saved one, else local); its windows checkpoint when cancelled."""
    sweep_dir = Path(sweep_dir).resolve()
    check_trackers(cfg.train)  # said here, on the page, rather than in a background job's log
    if executor is not None:
        executor.check_reachable()
    with claim(sweep_dir) as lock:
        save_sweep_config(sweep_dir, cfg, executor or saved_executor(sweep_dir))
        return start_claimed(["sweep", "--resume", str(sweep_dir)], lock, "sweep", None)


def resume_sweep_job(sweep_dir: str | Path, executor: ExecutorConfig | None = None) -> Path:
    """Continue the sweep in sweep_dir with its saved config (and executor, unless one is given), in the
    background."""
    flags = executor.cli_args() if executor else []
    return launch(["sweep", "--resume", str(Path(sweep_dir).resolve()), *flags], sweep_dir, kind="sweep")


def launch_reproduce(cfg: ReproduceConfig, folder: str | Path, executor: ExecutorConfig | None = None) -> Path:
    """Start (or continue) a reproduction study in the background, its tasks run by `executor` (default: the
    study's saved one, else local); it stops after the current training step or task when cancelled."""
    folder = Path(folder).resolve()
    if executor is not None:
        executor.check_reachable()
    with claim(folder) as lock:
        save_config(folder, cfg, executor or study_executor(folder))  # refused: a folder with another study
        return start_claimed(["reproduce", "--resume", str(folder)], lock, "reproduce", None)


def resume_reproduce_job(folder: str | Path, executor: ExecutorConfig | None = None) -> Path:
    """Continue the study in `folder` with its saved settings (and executor, unless one is given), in the
    background."""
    flags = executor.cli_args() if executor else []
    return launch(["reproduce", "--resume", str(Path(folder).resolve()), *flags], folder, kind="reproduce")


def deck_argv(cfg: DeckConfig, folder: str | Path) -> list[str]:
    """The `steer --deck` command line that prepares (or resumes) the deck in `folder`: the command reads the deck's
    settings from its deck.json (create_deck), so only the adapter and the precision are spelled."""
    return ["steer", "--run", cfg.adapter, "--deck", str(folder), "--precision", cfg.precision]


def launch_deck(cfg: DeckConfig, folder: str | Path) -> Path:
    """Write the deck `cfg` into `folder` (the same config again resumes it; another deck there is refused, a RunError)
    and prepare it in the background; it stops between summaries when cancelled."""
    folder = Path(folder).absolute()
    with claim(folder) as lock:  # written under the lock: a twin launch cannot change the deck being prepared
        create_deck(folder, cfg)
        return start_claimed(deck_argv(cfg, folder), lock, "deck", None)


def resume_deck_job(folder: str | Path) -> Path:
    """Continue preparing the deck in `folder` with its own settings, in the background (what is made is kept)."""
    deck = read_deck(folder)
    if deck is None:
        raise JobError(f"{folder} holds no deck (no deck.json); prepare one first.")
    return launch(deck_argv(deck.config, Path(folder).absolute()), folder, kind="deck")


def default_run_name(cfg: TrainConfig) -> str:
    model = Path(cfg.model).name.replace("/", "_")
    return f"{cfg.method}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"
