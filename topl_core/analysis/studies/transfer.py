"""Detection transfer: how well an adapter's token detectors find bad tokens, on development data and on held-out
data that no choice of settings may look at.

Stages (the perturbation data split by document with the run's split seed, CLIFF by its own `cut` column):

    dev       the val split of the adapter's training data + CLIFF rows with cut == "val", one set per CLIFF source
    heldout   the test split + CLIFF rows with cut == "test"

Detectors, scored on exactly the same tokens (score = how bad a token looks):

    head          the run's trained head, 1 − p(good); an adapter without one gets a probe head fitted on its hidden
                  states (analysis/probe_head.py) from the training split
    frozen probe  the same kind of linear probe at the head's layer on the base model's states (adapter disabled),
                  fitted on the same training records: the data-matched control, what a probe of the model the
                  adapter started from already finds
    surprisal     the base model's −log p(token | prefix)
    controls      no model at all (analysis/lexical.py): the lexical control (the token's word does not occur in
                  the document), a new number or name (a number or capitalised word absent from it), the token's
                  position in the response — what a detector must beat to be more than a word-matcher

Each row gives the AUROC of flagging bad tokens (gold label 0; unlabelled tokens ignored) with a 95% percentile
bootstrap CI that resamples records (tokens of one record are correlated), the same resamples for every detector
(detection_stats.py: the tokens' arrays per detector and their AUROCs).

Held-out accounting: every held-out evaluation, a cache hit included, appends a line to
cache/analysis/transfer/heldout_log.jsonl; the table says how many held-out evaluations of the adapter (by
fingerprint) were logged before it.

    TransferSettings(stage="dev", max_records_per_set=128, probe_records=128, bootstrap=1000, seed=0,
                     detokenized_cliff=False, ...)
    transfer_table(adapters, settings, cliff_path=None, records=None, progress=None, heads=None) -> DataFrame (COLUMNS;
        attrs["heldout_before"]: {adapter: count}, attrs["notes"]: [what was skipped, and why]; `heads`, a dict
        given, gets {(adapter, set): the labelled tokens' record, bad and head score} (two heads paired on them)
    evaluation_sets(adapter, stage, labelled, cliff, max_records) -> {set name: records}   (stage_sets: by split seed)
    detection_scorer(adapter, labelled, settings) -> TokenScorer   head + frozen probe (probe_on_base) + surprisal
    training_records(adapter, records=None) -> [Record]   the token-labelled training data (DataError if none)
    load_cliff(path=None, detokenized=False) -> (CsvLoadReport | None, notes)   a missing default is skipped, noted
    heldout_log_path() -> Path;  heldout_count(adapter) -> int
    format_markdown(table) -> str

Choosing layer m from data: `layer_scan` fits the frozen probe at every layer of the base model (or the adapter,
adapter_enabled=True) from one forward per batch and reports its AUROC per layer on the dev sets only.

    layer_scan(adapter, settings, layers=None, cliff_path=None, records=None, adapter_enabled=False) -> DataFrame
        (layer, set, auroc, tokens); cached like the scores

Token scores per (adapter, set) are cached (NPZ, keyed by the adapter's fingerprint, the set's and the training
records' fingerprints and the scoring settings); the bootstrap runs on them each time.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from ...data.cliff import CsvLoadReport, load_factuality_csv
from ...data.records import Record, read_jsonl, records_fingerprint
from ...data.split import split_records
from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError, DataError
from ...foundations.io import read_log_rows
from ...foundations.paths import cliff_csv, project_path
from ...hardware.precision import PRECISION_HELP, PRECISIONS, resolve_precision
from ...inference.token_scores import TokenScorer
from ...models.loading import ModelSpec, load_model
from ...training.adapters import Adapter, open_adapter
from ..cache import NPZ, analysis_cache_dir, cached
from ..lexical import CONTROLS
from ..lora_a.probe_head import ProbeHeadSettings, fit_probe_head
from .detection_stats import DETECTORS, bootstrap_auroc, token_arrays

Stage = Literal["dev", "heldout"]
STAGES: tuple[str, ...] = ("dev", "heldout")
SPLIT_OF_STAGE = {"dev": "val", "heldout": "test"}  # the data split and the CLIFF cut each stage reads
COLUMNS = ["adapter", "stage", "set", "detector", "auroc", "ci_low", "ci_high", "tokens", "records", "pct_bad"]


@dataclass(frozen=True)
class TransferSettings:
    stage: Stage = config_field(
        "dev",
        label="Stage",
        help="dev: val split + CLIFF cut val, to compare and choose settings; heldout: test split + CLIFF cut test, "
        "for the figures you report (logged)",
    )
    max_records_per_set: int = config_field(
        128, label="Records per set", help="the first N records of each set, in file order", min=1, flag="--max-records"
    )
    probe_records: int = config_field(
        128,
        label="Frozen-probe records",
        help="training records of the frozen probe (and of a probe head for a headless adapter)",
        min=1,
    )
    bootstrap: int = config_field(
        1000, label="Bootstrap resamples", help="record resamples for the 95% CI (0: no CI)", min=0
    )
    seed: int = config_field(0, label="Seed", help="bootstrap seed", min=0)
    precision: str = config_field("auto", label="Precision", help=PRECISION_HELP)
    batch_size: int = config_field(8, label="Batch size", help="records per forward pass", min=1, max=256)
    detokenized_cliff: bool = config_field(
        False,
        label="Detokenized CLIFF",
        help="undo CLIFF's tokenized forms ('30 - year - old', -lrb-, \"did n't\"; data/textform.py) before scoring; "
        "spans move with it",
        flag="--detokenize-cliff",
    )

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(
                f"stage={self.stage!r}: use 'dev' (val split, CLIFF cut val) to compare and choose settings, or "
                "'heldout' (test split, CLIFF cut test) once, for the figures you report."
            )
        for name in ("max_records_per_set", "probe_records", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be at least 1.")
        if self.bootstrap < 0:
            raise ConfigError(f"bootstrap={self.bootstrap!r} must be ≥ 0 (0: no confidence interval).")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision={self.precision!r} must be one of {PRECISIONS}.")


def training_records(adapter: Adapter, records: Sequence[Record] | None = None) -> list[Record]:
    """The token-labelled records of the adapter's training data (its run's data file), or of `records`."""
    source = "the given records" if records is not None else str(project_path(adapter.settings.data))
    if records is None:
        records = read_jsonl(project_path(adapter.settings.data))
    labelled = [r for r in records if r.token_labels_known]
    if not labelled:
        raise DataError(
            f"{source}: no record has token labels (token_labels_known), so bad tokens cannot be counted. Use "
            "perturbation data (python -m topl_core data build) or FAVA spans, e.g. --data cache/data/"
            "halueval-perturbed.jsonl."
        )
    return labelled


def load_cliff(path: str | Path | None, detokenized: bool = False) -> tuple[CsvLoadReport | None, list[str]]:
    """CLIFF's span CSV and notes: at `path` (a missing file is an error), or at paths.cliff_csv() when None (a
    missing default is skipped, with the reason in the notes)."""
    if path is None and not cliff_csv().is_file():
        return None, [f"CLIFF sets skipped: {cliff_csv()} not found (give its path with --cliff / cliff_path)."]
    report = load_factuality_csv(path if path is not None else cliff_csv(), detokenized=detokenized)
    if not report.token_level:
        raise DataError(f"{report.path}: no annotated_span column; the CLIFF sets need span labels.")
    skipped = [f"CLIFF: {len(report.skipped)} of {report.rows_read} rows skipped (annotated span not found)"]
    return report, skipped if report.skipped else []


def evaluation_sets(
    adapter: Adapter, stage: str, labelled: Sequence[Record], cliff: CsvLoadReport | None, max_records: int
) -> dict[str, list[Record]]:
    """The sets of a stage, each capped at its first `max_records` records (possibly empty): the adapter's data
    split (by document, its split seed), one set per source in order of first appearance (a merged file of
    perturbations and own summaries gives two), then each CLIFF source's rows of the stage's cut."""
    return stage_sets(adapter.settings.split_seed, stage, labelled, cliff, max_records)


def stage_sets(
    split_seed: int, stage: str, labelled: Sequence[Record], cliff: CsvLoadReport | None, max_records: int
) -> dict[str, list[Record]]:
    """evaluation_sets for a split seed (what an adapter's settings give it)."""
    split = SPLIT_OF_STAGE[stage]
    sets: dict[str, list[Record]] = {}
    for r in split_records(labelled, seed=split_seed)[split]:
        sets.setdefault(f"{r.source}/{split}", []).append(r)
    for source in sorted(cliff.sources) if cliff is not None else ():
        recs = [r for r in cliff.records if r.source == source and r.meta.get("cut") == split]
        cut = f"{source}/{split}" + (" (CLIFF cut)" if f"{source}/{split}" in sets else "")
        sets[cut + (" detokenized" if recs and recs[0].meta.get("text_form") == "detokenized" else "")] = recs
    return {name: recs[:max_records] for name, recs in sets.items()}


def heldout_log_path() -> Path:
    return analysis_cache_dir() / "transfer" / "heldout_log.jsonl"


def heldout_count(adapter) -> int:
    """How many held-out evaluations of this adapter (its fingerprint) the log holds."""
    fingerprint = open_adapter(adapter).fingerprint()
    return sum(row.get("fingerprint") == fingerprint for row in read_log_rows(heldout_log_path()))


def _log_heldout(adapter: Adapter, sets: Mapping[str, Sequence[Record]], settings: TransferSettings) -> None:
    row = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "adapter": adapter.name,
        "path": str(adapter.path),
        "fingerprint": adapter.fingerprint(),
        "sets": {name: len(recs) for name, recs in sets.items()},
        "settings": asdict(settings),
    }
    path = heldout_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # one line per write: a crash leaves at most one bad last line
        f.write(json.dumps(row, sort_keys=True) + "\n")


def detection_scorer(adapter: Adapter, labelled: Sequence[Record], settings: TransferSettings) -> TokenScorer:
    """A scorer with the adapter's head (or a probe head) and the frozen probe at the same layer."""
    cfg = adapter.settings
    probe = ProbeHeadSettings(
        max_records=settings.probe_records,
        max_val_records=0,
        batch_size=settings.batch_size,
        precision=settings.precision,
        split_seed=cfg.split_seed,  # the adapter's own training split: never its val or test documents
    )
    head = None
    if adapter.has_head:
        layer = int(adapter.head_layer)
    else:
        fitted = fit_probe_head(adapter, labelled, probe)
        layer, head = fitted.layer, (fitted.layer, fitted.linear(adapter.device))
    frozen = fit_probe_head(adapter, labelled, replace(probe, layer=layer), adapter_enabled=False)
    return TokenScorer(
        load_model(ModelSpec.computing(adapter.base_model, settings.precision, adapter.device)),
        adapter,
        settings.precision,
        cfg.max_doc_tokens,
        cfg.max_response_tokens,
        head=head,
        probe_on_base=(frozen.layer, frozen.linear(adapter.device)),
    )


def _token_arrays(scorer: TokenScorer, records: Sequence[Record], batch_size: int) -> dict[str, np.ndarray]:
    """Labelled tokens of `records`: record index, bad (1) / good (0), and each detector's score."""
    return token_arrays(records, scorer.score(records, batch_size=batch_size))


def _rows(adapter: Adapter, stage: str, name: str, t: Mapping[str, np.ndarray], settings: TransferSettings) -> list:
    cis = bootstrap_auroc(t["bad"], {d: t[d] for d in DETECTORS}, t["record"], settings.bootstrap, settings.seed)
    n_tokens = len(t["bad"])
    common = dict(
        tokens=n_tokens,
        records=len(np.unique(t["record"])),
        pct_bad=float(100 * t["bad"].mean()) if n_tokens else float("nan"),
    )
    return [
        dict(adapter=adapter.name, stage=stage, set=name, detector=d, **cis[d]._asdict(), **common) for d in DETECTORS
    ]


def transfer_table(
    adapters: Sequence,
    settings: TransferSettings = TransferSettings(),
    cliff_path: str | Path | None = None,
    records: Sequence[Record] | None = None,
    progress: Callable[[str], None] | None = None,
    heads: dict | None = None,
) -> pd.DataFrame:
    """One row per adapter × set × detector (COLUMNS), for `settings.stage`. `records` replaces every adapter's
    training data file (its val/test split is evaluated; its train split fits the probes). `progress(message)`
    is called as each set starts. A held-out call logs one line per adapter, also when served from the cache."""
    adapters = [open_adapter(a) for a in adapters]
    if not adapters:
        raise ConfigError("no adapter given: name at least one (a run directory, a PEFT folder or a hub id).")
    cliff, notes = load_cliff(cliff_path, settings.detokenized_cliff)
    rows, before = [], {}
    for adapter in adapters:
        labelled = training_records(adapter, records)
        sets = evaluation_sets(adapter, settings.stage, labelled, cliff, settings.max_records_per_set)
        empty = [name for name, recs in sets.items() if not recs]
        sets = {name: recs for name, recs in sets.items() if recs}
        notes += [f"{adapter.name}: {name} is empty (too few documents, or no rows of that cut)" for name in empty]
        before[adapter.name] = heldout_count(adapter)
        scorer = functools.cache(
            lambda adapter=adapter, labelled=labelled: detection_scorer(adapter, labelled, settings)
        )
        for name, recs in sets.items():
            if progress is not None:
                progress(f"{adapter.name}: {name} ({len(recs)} records)")
            key = {
                "analysis": "transfer",
                "set": records_fingerprint(recs),
                "train": records_fingerprint(labelled),
                "probe_records": settings.probe_records,
                "precision": resolve_precision(settings.precision, adapter.device),
                "controls": list(CONTROLS),  # the arrays hold each control's scores too
            }
            arrays = cached(
                "transfer",
                key,
                lambda recs=recs, scorer=scorer: _token_arrays(scorer(), recs, settings.batch_size),
                NPZ,
                adapter=adapter,
            )
            rows += _rows(adapter, settings.stage, name, arrays, settings)
            if heads is not None:
                heads[adapter.name, name] = {k: arrays[k] for k in ("record", "bad", "head")}
        if settings.stage == "heldout":
            _log_heldout(adapter, sets, settings)
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs.update(heldout_before=before, notes=notes)
    return table


def format_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """A markdown table (one row per adapter × set × detector: AUROC [95% CI], tokens, records, % bad), then the
    held-out count and the notes of table.attrs."""
    lines = [
        "| adapter | stage | set | detector | AUROC [95% CI] | tokens | records | % bad |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in table.itertuples(index=False):
        ci = "" if np.isnan(r.ci_low) else f" [{r.ci_low:.{digits}f}, {r.ci_high:.{digits}f}]"
        lines.append(
            f"| {r.adapter} | {r.stage} | {r.set} | {r.detector} | {r.auroc:.{digits}f}{ci} | {r.tokens} | "
            f"{r.records} | {r.pct_bad:.1f} |"
        )
    when = "before this evaluation" if len(table) and table["stage"].iloc[0] == "heldout" else "so far"
    footer = [
        f"- {name}: held-out sets evaluated {n} time(s) {when}"
        for name, n in table.attrs.get("heldout_before", {}).items()
    ]
    footer += [f"- {note}" for note in table.attrs.get("notes", [])]
    lines += ["", *footer] if footer else []
    return "\n".join(lines)
