"""Seeded perturbations of a faithful summary S into S' with exact character spans of every edit: the recipes
(which edit kinds, how many documents lower-cased), drawing 1–3 non-overlapping edits per summary, applying them,
and building the labelled records. The edit kinds: fact_edits.py ("v1": entity, number, date, negation, relation,
invented) and summarizer_edits.py ("v2": attribution, swap, extrinsic, modal, copied).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..foundations.errors import DataError
from .fact_edits import (
    EDIT_KINDS,
    Edit,
    apply_edits,
    date_edits,
    entity_edits,
    extract_names,
    invented_edits,
    negation_edits,
    number_edits,
    relation_edits,
)
from .records import Record, Span
from .summarizer_edits import attribution_edits, copied_edits, extrinsic_edits, modal_edits, swap_edits

V2_KINDS: tuple[str, ...] = EDIT_KINDS + ("attribution", "swap", "extrinsic", "modal", "copied")
ALL_KINDS = V2_KINDS
MAX_EDITS = 3


@dataclass(frozen=True)
class Recipe:
    """How perturbation records are made: the edit kinds drawn from, and the share of documents whose records are
    lower-cased (document and both responses; spans unchanged) so that lower-cased text, as in some CNN/DM
    releases, is not foreign to a head."""

    kinds: tuple[str, ...] = EDIT_KINDS
    lowercase_share: float = 0.0


# "v1": the original six kinds (the default data set and the demo adapters); "v2": all kinds, 15% lower-cased.
RECIPES: dict[str, Recipe] = {"v1": Recipe(), "v2": Recipe(V2_KINDS, 0.15)}


def _candidate_edits(
    summary: str, document: str, donor_texts: Sequence[str], rng: random.Random, kinds: Sequence[str] = EDIT_KINDS
) -> dict[str, list[Edit]]:
    document_names = list(dict.fromkeys(n for _, _, n in extract_names(document)))
    donor_names = list(dict.fromkeys(n for text in donor_texts for _, _, n in extract_names(text)))
    candidates = {
        "entity": entity_edits(summary, list(dict.fromkeys(document_names + donor_names)), rng),
        "number": number_edits(summary, rng),
        "date": date_edits(summary, rng),
        "negation": negation_edits(summary),
        "relation": relation_edits(summary),
        "invented": invented_edits(summary, document_names or donor_names, rng),
    }
    # The v2 kinds draw from the rng only when asked for, so v1 data stays what it was for a seed.
    more = {
        "attribution": lambda: attribution_edits(summary, document, document_names, rng),
        "swap": lambda: swap_edits(summary, document),
        "extrinsic": lambda: extrinsic_edits(summary, document, rng),
        "modal": lambda: modal_edits(summary),
        "copied": lambda: copied_edits(summary, document, document_names or donor_names, rng),
    }
    candidates |= {kind: make() for kind, make in more.items() if kind in kinds}
    return {kind: candidates[kind] for kind in kinds}


def perturb_summary(
    summary: str,
    document: str,
    rng: random.Random,
    donor_texts: Sequence[str] = (),
    n_edits: int | None = None,
    kinds: Sequence[str] = EDIT_KINDS,
) -> tuple[str, tuple[Span, ...]]:
    """Perturb `summary` with `n_edits` non-overlapping edits (random 1-3 when None).

    Each edit picks a kind uniformly among the kinds that still have a candidate not touching an earlier edit,
    then a random candidate of that kind. Fewer edits are made when candidates run out; at least one is always
    made (an invented sentence at the start of the summary is always possible). Returns S' and the spans of
    S' that were edited, sorted by position.
    """
    if not summary.strip():
        raise DataError("perturb_summary: the summary is empty; drop that row or give it a summary.")
    if n_edits is None:
        n_edits = rng.randint(1, MAX_EDITS)
    if n_edits < 1:
        raise DataError(f"perturb_summary: n_edits={n_edits} must be at least 1 (or None for a random 1-{MAX_EDITS}).")
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown or "invented" not in kinds:
        raise DataError(
            f"perturb_summary: kinds {sorted(kinds)} must be among {ALL_KINDS} and include 'invented' (the edit "
            "that is always possible)."
        )
    candidates = _candidate_edits(summary, document, donor_texts, rng, kinds)
    chosen: list[Edit] = []
    for _ in range(n_edits):
        free = {
            k: [e for e in edits if not any(e.conflicts_with(c) for c in chosen)] for k, edits in candidates.items()
        }
        open_kinds = [k for k in kinds if free[k]]
        if not open_kinds:
            break
        edit = rng.choice(free[rng.choice(open_kinds)])
        chosen.append(edit)
        if edit.kind in ("invented", "copied"):  # their candidates insert the same sentence: insert it once
            candidates[edit.kind] = []
    return apply_edits(summary, chosen)


def build_perturbation_records(
    pairs: Iterable[tuple[str, str, str]],
    seed: int,
    source: str = "halueval-perturbed",
    donors_per_document: int = 2,
    progress=None,
    recipe: Recipe = RECIPES["v1"],
) -> list[Record]:
    """Two records per (doc_id, document, faithful_summary): the faithful summary (all good) and a perturbed one.

    Entity swaps and invented sentences may also draw names from `donors_per_document` other documents of
    `pairs`. Each document's edits come from `random.Random(f"{seed}:{doc_id}")`: deterministic for a seed.
    `recipe` picks the edit kinds and the lower-cased share (drawn from a second generator, so that a recipe
    without lower-casing gives the same records as before it existed). `progress(done, total)` is called after
    each document.
    """
    pairs = list(pairs)
    n_donors = min(donors_per_document, len(pairs) - 1)
    records = []
    for index, (doc_id, document, summary) in enumerate(pairs):
        rng = random.Random(f"{seed}:{doc_id}")
        other_indices = (i + (i >= index) for i in rng.sample(range(len(pairs) - 1), n_donors))  # skip `index`
        donors = [pairs[i][1] for i in other_indices]
        perturbed, spans = perturb_summary(summary, document, rng, donors, kinds=recipe.kinds)
        if recipe.lowercase_share and random.Random(f"{seed}:{doc_id}:case").random() < recipe.lowercase_share:
            document, summary, perturbed = _lowercased(document, summary, perturbed)
        records.append(
            Record(
                id=f"{doc_id}:faithful",
                document=document,
                response=summary,
                sequence_label=1,
                source=source,
                doc_id=doc_id,
            )
        )
        records.append(
            Record(
                id=f"{doc_id}:perturbed",
                document=document,
                response=perturbed,
                bad_spans=spans,
                sequence_label=0,
                faithful_response=summary,
                source=source,
                doc_id=doc_id,
                meta={"edits": [s.kind for s in spans]},
            )
        )
        if progress is not None:
            progress(index + 1, len(pairs))
    return records


def _lowercased(*texts: str) -> tuple[str, ...]:
    """The texts lower-cased, or unchanged when lower-casing would change a length (and so move the spans)."""
    lowered = tuple(t.lower() for t in texts)
    return lowered if all(len(a) == len(b) for a, b in zip(texts, lowered)) else texts
