"""The documents an evaluation summarises: the held-out test split of the training data (ID), and CLIFF or a
factuality benchmark's datasets (OOD).

    id_documents(cfg) -> list[EvalDoc]      first n_id documents of the held-out *test* split of `data`
    ood_documents(cfg, cut=None) -> list[EvalDoc]   n_ood CLIFF documents, alternating cliff-xsum / cliff-cnndm
                                            (only CLIFF's own `cut` "val" or "test" when given); or, with
                                            cfg.ood_data (AggreFact, LLM-AggreFact), n_ood per dataset
    benchmark_rows(spec), hub_rows(dataset_id, fix)   the rows of a benchmark file or hub dataset
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ...data.cliff import csv_rows
from ...data.records import read_jsonl
from ...data.split import first_documents, split_records
from ...foundations.errors import DataError
from ...foundations.paths import cliff_csv, project_path
from .config import EvalConfig


@dataclass(frozen=True)
class EvalDoc:
    set: str  # "ID" or "OOD"
    source: str
    doc_id: str
    document: str


def id_documents(cfg: EvalConfig) -> list[EvalDoc]:
    """The first n_id distinct documents of the test split (document-level split, as in training)."""
    if cfg.n_id == 0:
        return []
    test = split_records(read_jsonl(project_path(cfg.data)), seed=cfg.split_seed)["test"]
    return [
        EvalDoc("ID", r.source.replace("-perturbed", ""), r.doc_id, r.document) for r in first_documents(test, cfg.n_id)
    ]


def ood_documents(cfg: EvalConfig, cut: str | None = None) -> list[EvalDoc]:
    """OOD documents. Default: n_ood distinct CLIFF documents, taken alternately from each source (cliff-xsum,
    cliff-cnndm), in file order — with `cut`, only the rows of CLIFF's own cut column ("val" to choose settings on,
    "test" to report); empty when the CSV is absent. With cfg.ood_data: up to n_ood distinct documents of every
    dataset in that benchmark (source = its dataset, and origin when the file has one), in file order."""
    if cfg.n_ood == 0:
        return []
    if cfg.ood_data:
        if cut is not None:
            raise DataError(f"cut={cut!r}: only CLIFF has cuts; drop ood_data to read CLIFF's {cut} documents.")
        return _benchmark_documents(cfg.ood_data, cfg.n_ood)
    path = Path(cfg.cliff_csv) if cfg.cliff_csv else cliff_csv()
    if not path.is_file():
        return []
    by_source: dict[str, list[EvalDoc]] = {}
    seen = set()
    for row in csv_rows(path, required=("doc",) if cut is None else ("doc", "cut")):
        doc_id = f"{row.get('origin', 'cliff')}-{row.get('id', '')}"
        if doc_id in seen or (cut is not None and row["cut"] != cut):
            continue
        seen.add(doc_id)
        source = f"cliff-{row['origin']}" if row.get("origin") else "cliff"
        by_source.setdefault(source, []).append(EvalDoc("OOD", source, doc_id, row["doc"]))
    out, queues = [], [list(v) for _, v in sorted(by_source.items())]
    while len(out) < cfg.n_ood and any(queues):
        for q in queues:
            if q and len(out) < cfg.n_ood:
                out.append(q.pop(0))
    return out


def _benchmark_documents(spec: str, per_dataset: int) -> list[EvalDoc]:
    out, seen, count = [], set(), Counter()
    for row in benchmark_rows(spec):
        source = "-".join(str(row[c]) for c in ("dataset", "origin") if row.get(c)) or "ood"
        doc = str(row["doc"])
        doc_id = f"{source}-{row.get('id') or hashlib.sha256(doc.encode()).hexdigest()[:12]}"
        if doc_id in seen or count[source] >= per_dataset:
            continue
        seen.add(doc_id)
        count[source] += 1
        out.append(EvalDoc("OOD", source, doc_id, doc))
    return out


def benchmark_rows(spec: str) -> list[dict]:
    """The rows of a factuality benchmark (AggreFact, LLM-AggreFact): a CSV or parquet file with at least doc and
    dataset columns, or a hub dataset id (needs a hub; its "test" split, else its first)."""
    path = Path(spec)
    if path.is_file():
        if path.suffix == ".parquet":
            import pandas as pd

            try:
                table = pd.read_parquet(path)
            except Exception as e:  # pyarrow's own error types for a file that is not parquet
                raise DataError(f"{path}: not a readable parquet file ({e}).") from e
            rows = table.astype(str).to_dict("records")
        else:
            rows = csv_rows(path, required=())  # the columns are checked below, for every kind of input
    elif path.suffix in (".csv", ".parquet") or not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise DataError(f"{spec}: no such file. Give the path of an AggreFact / LLM-AggreFact CSV or parquet file.")
    else:
        rows = hub_rows(spec, "Give the path of a CSV or parquet copy.")
    absent = [c for c in ("doc", "dataset") if rows and c not in rows[0]]
    if absent or not rows:
        raise DataError(
            f"{spec}: {'no rows' if not rows else f'missing column(s) {absent}'}; a benchmark needs "
            "doc and dataset columns (one row per summary or claim)."
        )
    return rows


def hub_rows(dataset_id: str, fix: str, config: str | None = None, split: str | None = None) -> list[dict]:
    """The rows of a hub dataset (needs a hub): `split`, else its "test" split, else its first. Any failure (no hub
    here, an unknown or gated id) is a DataError ending with `fix` (what to give instead)."""
    try:
        import datasets

        if split is None:
            loaded = datasets.load_dataset(dataset_id, config)
            table = loaded["test" if "test" in loaded else next(iter(loaded))]
        else:
            table = datasets.load_dataset(dataset_id, config, split=split)
        return [dict(r) for r in table]
    except Exception as e:
        raise DataError(
            f"{dataset_id}: not a file here, and loading it as a hub dataset failed ({type(e).__name__}: {e}). {fix}"
        ) from e
