"""Label-sensitivity study (docs/design.md §2): TOPL trained on each label setting of topl_core.data.label_settings
(original, random, balanced, bad_skewed, good_skewed, good_only, dense_balanced) with everything else fixed, and
the scores per setting next to the stats of the labels it trained on (#tokens, % good, % bad).

Public API
    LabelStudyConfig(train=TrainConfig(...), settings=LABEL_SETTINGS, n_cliff=0, cliff_csv=None, n_generate=0)
    label_stats_for(cfg, records=None, tokenizer=None) -> DataFrame
        one row per setting: tokens, good, bad, pct_good, pct_bad, examples — exactly the labels the trainer
        uses: the train split encoded by the TOPL method, then data.variants.apply_label_setting(…, cfg.seed)
    run_label_study(cfg, out_dir, progress=None, records=None, base_loader=None, executor=ExecutorConfig())
        trains out_dir/<setting>/ per setting, each a task (in this process, or as Ray tasks: foundations/executor.py;
        resumable: finished runs are kept, interrupted ones resume) and
        returns the stats columns plus val_token_auroc (head token AUROC on the *original* validation labels),
        val_heads (those tokens' record, bad and head score, to pair two settings), optionally cliff_token_auroc
        (head vs CLIFF span labels on n_cliff records) and gen_factuality.
    read_label_study(out_dir) -> DataFrame     the table from the run directories (what has finished so far)

Every setting changes only the training labels: validation always scores against the original labels, so the
columns compare what each labelling teaches, not how easy its own labels are.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from ...data.cliff import load_factuality_csv
from ...data.label_settings import LABEL_SETTINGS, apply_label_setting, label_stats
from ...data.records import read_jsonl
from ...data.split import split_records
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError, RunError
from ...foundations.executor import ExecutorConfig, failure_report, run_tasks
from ...foundations.io import write_json
from ...foundations.paths import cliff_csv
from ...foundations.status import WriterLock
from ...inference.token_scores import TokenScorer, detection_auroc
from ...models.loading import LoadedModel, ModelSpec, load_model
from ...training.batching import EncodeSettings
from ...training.config import TrainConfig
from ...training.methods import METHODS
from ...training.run_dirs import RunDir
from ...training.tracking import check_trackers
from ...training.trainer import train
from ..evaluation.config import EvalConfig, Variant
from ..evaluation.evaluate import evaluate
from .detection_stats import token_arrays
from .study import Study, StudyConfig

STUDY_FILE = "label_study.json"


@dataclass(frozen=True)
class LabelStudyConfig(StudyConfig):
    settings: tuple[str, ...] = config_field(
        LABEL_SETTINGS, label="Label settings", help="the label settings to train on", choices=LABEL_SETTINGS
    )
    n_cliff: int = config_field(
        0,
        label="CLIFF records",
        help="also head token AUROC on this many CLIFF span records (out of domain)",
        min=0,
    )
    cliff_csv: str | None = config_field(
        None, label="CLIFF CSV", help="CLIFF CSV (default: the shipped CLIFF_error_types.csv)", flag="--cliff"
    )

    what_it_trains: ClassVar[str] = "the label study trains TOPL"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "settings", tuple(self.settings))
        bad = [s for s in self.settings if s not in LABEL_SETTINGS]
        if bad or not self.settings:
            raise ConfigError(f"settings={self.settings!r}: choose a non-empty subset of {LABEL_SETTINGS}.")

    def setting_config(self, setting: str) -> TrainConfig:
        return replace(self.train, label_setting=setting)

    def to_json(self) -> dict:
        d = asdict(self)
        d["train"], d["settings"] = self.train.to_json(), list(self.settings)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "LabelStudyConfig":
        return cls(**{**d, "train": TrainConfig.from_json(d["train"])})


def _train_labels(cfg: TrainConfig, records, tokenizer) -> list[np.ndarray]:
    """The per-example response labels the trainer starts from (train split, TOPL encoding)."""
    train_recs = split_records(records, seed=cfg.split_seed)["train"]
    examples = METHODS[cfg.method].prepare(
        tokenizer, train_recs, EncodeSettings(cfg.max_doc_tokens, cfg.max_response_tokens)
    )
    return [e.response_labels for e in examples]


def label_stats_for(cfg: LabelStudyConfig, records=None, tokenizer=None):
    """Rows per setting: the stats of the training labels under that setting (see the module docstring)."""
    import pandas as pd

    records = list(records) if records is not None else read_jsonl(cfg.train.data)
    tokenizer = (
        tokenizer or load_model(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device)).tokenizer
    )
    labels = _train_labels(cfg.train, records, tokenizer)
    return pd.DataFrame(
        [{"setting": s, **label_stats(apply_label_setting(labels, s, cfg.train.seed))} for s in cfg.settings]
    )


def _cliff_auroc(cfg: LabelStudyConfig, run: RunDir) -> dict:
    path = Path(cfg.cliff_csv) if cfg.cliff_csv else cliff_csv()
    if not path.is_file():
        return {}
    recs = list(load_factuality_csv(path).records)[: cfg.n_cliff]
    scorer = TokenScorer(
        load_model(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device)),
        run,
        precision=cfg.train.precision,
    )
    r = detection_auroc(scorer.score(recs))
    return {"cliff_token_auroc": r["head_auroc"], "cliff_tokens": r["tokens"]}


def _val_heads(cfg: LabelStudyConfig, run: RunDir, records) -> dict:
    """The setting's head on the original labels of the validation records the trainer scored (its split's first
    max_val_examples labelled records): each labelled token's record, bad and head score, so that two settings are
    compared on the same tokens with a record bootstrap (reproduce_tables.label_pairs)."""
    val = [r for r in split_records(records, seed=cfg.train.split_seed)["val"] if r.token_labels_known]
    val = val[: cfg.train.max_val_examples]
    base = load_model(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device))
    scorer = TokenScorer(base, run, precision=cfg.train.precision)
    arrays = token_arrays(val, scorer.score(val))
    return {"val_heads": {k: np.round(arrays[k], 6).tolist() for k in ("record", "bad", "head")}}


def _generation(cfg: LabelStudyConfig, run: RunDir) -> dict:
    ecfg = EvalConfig(
        data=cfg.train.data,
        split_seed=cfg.train.split_seed,
        n_id=cfg.n_generate,
        n_ood=0,
        max_new_tokens=cfg.max_new_tokens,
        max_doc_tokens=cfg.train.max_doc_tokens,
        scorer=cfg.scorer,
        model=cfg.train.model,
        device=cfg.train.device,
    )
    res = evaluate([Variant.merged(run.path)], ecfg, measure_quality=False)
    t = res.table()
    return {"gen_factuality": float(t["ID"].iloc[0]), "gen_sentences": float(t["sentences"].iloc[0])}


def _row(setting: str, run: RunDir) -> dict:
    metrics = run.read_metrics()
    val = next((r for r in reversed(metrics) if "val_token_auroc" in r), {})
    status = run.read_status()
    return {
        "setting": setting,
        "val_token_auroc": val.get("val_token_auroc", float("nan")),
        "val_tokens": val.get("val_tokens", 0),
        "loss": metrics[-1].get("loss") if metrics else float("nan"),
        "train_s": status.get("elapsed_s"),
        "state": status.get("state"),
        "run": str(run.path),
    }


def run_label_study(
    cfg: LabelStudyConfig,
    out_dir: str | Path,
    progress: Callable[[str], None] | None = None,
    records=None,
    base_loader: Callable[[], LoadedModel] | None = None,
    executor: ExecutorConfig = ExecutorConfig(),
):
    """Train TOPL on every setting (resumable) and return the table: stats + scores per setting. Each setting is a
    task (`train_setting`) run by `executor` (local: one after another here; ray: as Ray tasks); this process alone
    writes the study's files. One writer per study directory: a second study into out_dir while this one runs is
    refused."""
    out_dir = Path(out_dir)
    with WriterLock(out_dir):
        return _run_label_study(cfg, out_dir, progress, records, base_loader, executor)


def train_setting(study: Study[LabelStudyConfig], item: tuple[str, dict]) -> dict:
    """One label setting as a task (topl_core.foundations.executor): train out_dir/<setting> — or resume it, or find it
    complete — then compute the extra scores it does not have yet. Returns {"extras": …}, or {"cancelled": …} when
    the run did not finish."""
    setting, have = item
    cfg, say = study.cfg, study.progress or (lambda _: None)
    run = RunDir(study.folder / setting)
    if not run.is_complete:
        say(f"training setting {setting}")
        t0 = time.perf_counter()
        base = (
            study.base_loader()
            if study.base_loader
            else load_model(ModelSpec.computing(cfg.train.model, cfg.train.precision, cfg.train.device))
        )
        run = train(
            cfg.setting_config(setting), run.path, records=study.records, base=base, tracking_group=study.folder.name
        )
        say(f"  {setting}: {run.read_status().get('state')} in {time.perf_counter() - t0:.0f} s")
        if not run.is_complete:
            return {"cancelled": setting}
    have = dict(have)
    if "val_heads" not in have:
        have.update(_val_heads(cfg, run, study.records if study.records is not None else read_jsonl(cfg.train.data)))
    if cfg.n_cliff and "cliff_token_auroc" not in have:
        have.update(_cliff_auroc(cfg, run))
    if cfg.n_generate and "gen_factuality" not in have:
        have.update(_generation(cfg, run))
    return {"extras": have}


def _run_label_study(cfg: LabelStudyConfig, out_dir: Path, progress, records, base_loader, executor):
    check_trackers(cfg.train)  # a tracker asked for but not installed fails before any setting
    path = out_dir / STUDY_FILE
    if path.exists():
        old = LabelStudyConfig.from_json(json.loads(path.read_text())["config"])
        if replace(old, settings=cfg.settings) != cfg:
            raise RunError(
                f"{out_dir} holds a label study with a different config; use another directory or the same config."
            )
    write_json(path, {"config": cfg.to_json()})
    records = list(records) if records is not None else read_jsonl(cfg.train.data)
    extras_path = out_dir / "extras.json"
    extras = json.loads(extras_path.read_text()) if extras_path.exists() else {}

    def missing(setting: str) -> bool:
        have = extras.get(setting, {})
        return (
            not RunDir(out_dir / setting).is_complete
            or "val_heads" not in have
            or (cfg.n_cliff and "cliff_token_auroc" not in have)
            or bool(cfg.n_generate and "gen_factuality" not in have)
        )

    def on_done(item: tuple[str, dict], result: dict) -> bool:
        if "cancelled" in result:
            return False
        extras[item[0]] = result["extras"]
        write_json(extras_path, extras)
        return True

    todo = [(s, extras.get(s, {})) for s in cfg.settings if missing(s)]
    study = Study(cfg, out_dir, records, base_loader, progress if executor.kind == "local" else None)
    if progress and todo and executor.kind != "local":
        progress(f"{len(todo)} settings, {executor.describe()}")
    failures = run_tasks(train_setting, study, todo, executor, on_done)
    if failures:
        raise RunError(failure_report(out_dir, {f.item[0]: f for f in failures}))
    return read_label_study(out_dir, records=records)


def read_label_study(out_dir: str | Path, records=None, tokenizer=None):
    """The study table: label stats per setting joined with the scores of the settings trained so far."""
    import pandas as pd

    out_dir = Path(out_dir)
    cfg = LabelStudyConfig.from_json(json.loads((out_dir / STUDY_FILE).read_text())["config"])
    stats = label_stats_for(cfg, records, tokenizer)
    extras_path = out_dir / "extras.json"
    extras = json.loads(extras_path.read_text()) if extras_path.exists() else {}
    rows = []
    for setting in cfg.settings:
        run = RunDir(out_dir / setting)
        rows.append(
            {
                **(_row(setting, run) if run.config_path.exists() else {"setting": setting, "state": "not started"}),
                **extras.get(setting, {}),
            }
        )
    return stats.merge(pd.DataFrame(rows), on="setting", how="left")


__all__ = ["LabelStudyConfig", "label_stats_for", "run_label_study", "read_label_study"]
