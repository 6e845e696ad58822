"""A steering deck: every summary a talk shows, prepared beforehand so that the talk only reads files. This module
holds the deck's settings and files (what talk mode and the export read); deck_prepare.py prepares them.

A deck is an adapter, a steering mode, N documents and the mode's λ grid. `prepare_deck` (deck_prepare.py)
generates, per document, the base model's summary and the merged model's summary at every λ of the grid (the neutral
λ is the merged model itself; a document's missing λ positions are generated as one batch,
SteeringSession.generate_grid), and gives each the head's verdict — per-token p(good) of the adapter's own head (a TOPL
run's, or a probe head fitted on its hidden states), the share of flagged tokens (p(good) < FLAG_THRESHOLD) — beside
the offline factuality score. It is long work under the status protocol (foundations/status.py: progress, ETA, STOP) and
resumable: each finished summary is written at once (a STOP is heard between summaries: a batch's texts not yet judged
are dropped), and a restart generates only what is missing. A document file that cannot be read (cut short, edited) is
named — Deck.unreadable, PrepareStats.redone and status.json's "redone" — and its summaries are made again.

    DeckConfig(adapter, documents, lambdas, mode="vector", ...)      frozen; the neutral λ is always in the grid
    create_deck(folder, cfg) -> Path        deck.json (a folder holding another deck's config is refused)
    prepare_deck(folder, progress=None) -> PrepareStats            (deck_prepare.py)
    read_deck(folder) -> Deck               what talk mode and the export read; None where no deck.json is

Its page (talk mode in one HTML file, and inline in Jupyter) is deck_html.py's, which reads a Deck: this module knows
nothing of it.

The folder:

    deck.json           {"config": DeckConfig}
    head.json           the head used: {"kind": "run" | "probe" | "none", "auroc", "auroc_source", "layer", "reason"}
    doc-000.json        {"document", "base": Summary | null, "positions": {"<λ>": Summary}}   rewritten atomically
                        after each summary; Summary = {"text", "tokens", "p_good", "flagged_share", "factuality",
                        "degenerate", "seconds", "replacements", "gate"} (tokens / p_good / flagged_share null
                        without a head; degenerate: why the text is broken, analysis/fluency.py, or null;
                        replacements / gate: what a gated mode took back, steering/steered_text.py, else [] / null)
    status.json, STOP, LOCK, job.json, job.log      the job protocol
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from ...foundations.config_fields import config_field
from ...foundations.errors import ConfigError, RunError
from ...foundations.io import write_json
from ...foundations.paths import runs_dir, shipped_decks_dir
from ...foundations.presets import FLAG_THRESHOLD
from ...hardware.precision import PRECISION_HELP, PRECISIONS, Precision
from ...runtime.modes import SteerConfig, keep_field, mode_field, positions_field, tau_field, units_field
from ...runtime.steered_text import GateCounts, Replacement

CONFIG_FILE = "deck.json"
HEAD_FILE = "head.json"
HeadChoice = Literal["auto", "probe", "none"]
HEAD_CHOICES: tuple[str, ...] = ("auto", "probe", "none")


def decks_dir() -> Path:
    """Where the app keeps decks: runs/decks/ (TOPL_RUNS_DIR moves it with the runs)."""
    return runs_dir() / "decks"


def deck_folders() -> list[Path]:
    """Every deck to open: the user's under decks_dir(), newest first, then those shipped with the demo adapters
    (paths.shipped_decks_dir), by name."""
    user = sorted(_decks_in(decks_dir()), key=lambda d: -d.stat().st_mtime)
    shipped = shipped_decks_dir()
    return user + (sorted(_decks_in(shipped)) if shipped is not None else [])


def _decks_in(folder: Path) -> list[Path]:
    return [d for d in folder.iterdir() if (d / CONFIG_FILE).exists()] if folder.is_dir() else []


def is_shipped(folder: Path) -> bool:
    """A deck that ships with the repository (read-only: opened, never prepared again)."""
    shipped = shipped_decks_dir()
    return shipped is not None and Path(folder).resolve().parent == shipped.resolve()


@dataclass(frozen=True)
class DeckConfig:
    """A deck's settings: the adapter, the documents, the λ grid and how it steers (steering.SteerConfig's fields),
    the generation's length and the head that gives each token's verdict (a probe head's time: docs/performance.md);
    a gated mode reads the head the deck is prepared with, the run's or the probe head.

    Example: ``DeckConfig(str(adapter.path), documents=(document,), lambdas=(-2.0, 2.0), max_new_tokens=48)``"""

    adapter: str = config_field(label="Adapter", help="a run directory, a PEFT adapter folder or a hub id")
    documents: tuple[str, ...] = config_field(label="Documents", help="the texts to summarise")
    lambdas: tuple[float, ...] = config_field(
        label="λ grid", help="the λ positions, in the mode's units (the neutral λ, the merged model, joins them)"
    )
    mode: str = mode_field()
    positions: str = positions_field()
    units: str = units_field()
    top_k: int = config_field(
        4, label="Steered sites", help="how many sites are steered: the best o_proj / down_proj by LoRA-A AUROC", min=1
    )
    max_new_tokens: int = config_field(64, label="Max new tokens", help="the longest summary, in tokens", min=1)
    head: HeadChoice = config_field(
        "auto",
        label="Verdict head",
        help="the head whose p(good) colours each token: auto (the run's head when it has one, else none), probe "
        "(a probe head fitted on the adapter's hidden states) or none",
    )
    data: str | None = config_field(
        None,
        label="Labelled data",
        help="records of the steering vectors (val split) and of a probe head (default: the adapter's training data)",
    )
    # the Steering page's default, so that a deck and the page share the vectors' cache entry
    token_records: int = config_field(
        16, label="Token records", help="the first N labelled val records give the vectors' μ+ / μ−", min=1
    )
    precision: Precision = config_field("auto", label="Precision", help=PRECISION_HELP)
    tau: float = tau_field()
    keep: int = keep_field()

    def __post_init__(self) -> None:
        object.__setattr__(self, "documents", tuple(self.documents))
        SteerConfig(self.mode, self.positions, self.units, self.tau, self.keep)  # names a wrong field, its choices
        if not self.documents or any(not d.strip() for d in self.documents):
            raise ConfigError(
                f"DeckConfig.documents: {len(self.documents)} given, {sum(not d.strip() for d in self.documents)} "
                "empty; give at least one non-empty document."
            )
        lams = [float(x) for x in self.lambdas]
        if not lams or not all(math.isfinite(x) for x in lams):
            raise ConfigError(f"DeckConfig.lambdas={self.lambdas!r}: give at least one finite λ.")
        # sorted, unique, and the neutral λ (the merged model) always in: it is the deck's "merged" column
        object.__setattr__(self, "lambdas", tuple(sorted({round(x, 6) for x in lams} | {self.how.neutral})))
        for name, value, choices in (("head", self.head, HEAD_CHOICES), ("precision", self.precision, PRECISIONS)):
            if value not in choices:
                raise ConfigError(f"DeckConfig.{name}={value!r}: choose one of {choices}.")
        for name in ("top_k", "max_new_tokens", "token_records"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DeckConfig.{name}={getattr(self, name)}: must be at least 1.")

    @property
    def how(self) -> SteerConfig:
        return SteerConfig(self.mode, self.positions, self.units, self.tau, self.keep)

    @property
    def lambda_caption(self) -> str:
        """What λ means in this deck's mode and units (under the slider, in the app and in the export)."""
        return self.how.caption

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DeckConfig":
        return cls(**{**d, "documents": tuple(d["documents"]), "lambdas": tuple(d["lambdas"])})


def lambda_key(lam: float) -> str:
    """The key of a λ position in a document file."""
    return f"{float(lam):+.6f}"


@dataclass(frozen=True)
class Summary:
    """One generated text and the head's verdict on it (tokens / p_good / flagged_share None without a head; empty
    for an empty text). seconds: how long its generation took (a steered summary: its share of its λ grid's batch).
    A degenerate text keeps its factuality score, shown as not applicable. replacements / gate: in a gated mode, the
    tokens the head took back and what replaced them, and the gate's counts."""

    text: str
    factuality: float
    seconds: float
    tokens: tuple[str, ...] | None = None
    p_good: tuple[float, ...] | None = None
    flagged_share: float | None = None
    degenerate: str | None = None  # why the text is damage, not a summary (analysis/fluency.py); None when fluent
    replacements: tuple[Replacement, ...] = ()
    gate: GateCounts | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        tokens, p, gate = d.get("tokens"), d.get("p_good"), d.get("gate")
        return cls(
            d["text"],
            d["factuality"],
            d["seconds"],
            None if tokens is None else tuple(tokens),
            None if p is None else tuple(p),
            d.get("flagged_share"),
            d.get("degenerate"),
            tuple(Replacement(**r) for r in d.get("replacements") or ()),
            None if gate is None else GateCounts(**gate),
        )


@dataclass(frozen=True)
class DeckDocument:
    document: str
    base: Summary | None
    positions: dict[str, Summary]  # lambda_key(λ) → summary

    def at(self, lam: float) -> Summary | None:
        return self.positions.get(lambda_key(lam))

    def to_json(self) -> dict:
        positions = {k: v.to_json() for k, v in self.positions.items()}
        return {"document": self.document, "base": self.base and self.base.to_json(), "positions": positions}


@dataclass(frozen=True)
class Deck:
    """A deck as far as it is prepared (read_deck).

    Example: ``deck = read_deck("runs/decks/my-talk"); deck.done, deck.total, deck.head_note``; its page in a notebook:
    ``show_deck(deck)`` (deck_html.py)"""

    folder: Path
    config: DeckConfig
    head: dict  # head.json; {} before prepare has resolved the head
    documents: tuple[DeckDocument, ...]
    unreadable: tuple[tuple[Path, str], ...] = ()  # document files there but unreadable (cut short, edited), why

    def unreadable_notes(self, then: str) -> list[str]:
        """Each unreadable document file, why, and `then`: what is done about it (its summaries are made again)."""
        return [f"{path}: unreadable ({why}); {then}" for path, why in self.unreadable]

    @property
    def total(self) -> int:
        return len(self.config.documents) * (1 + len(self.config.lambdas))

    @property
    def done(self) -> int:
        return sum((d.base is not None) + len(d.positions) for d in self.documents)

    @property
    def complete(self) -> bool:
        return self.done == self.total

    @property
    def has_head(self) -> bool:
        return self.head.get("kind") in ("run", "probe")

    @property
    def head_note(self) -> str:
        """Whose verdict the colours are, and how good a detector it was on the validation split's tokens (held out from
        its training; the transfer protocol's held-out sets are others: docs/evaluation.md §6)."""
        if not self.has_head:
            return "No head's verdict: " + self.head.get("reason", "the deck is not prepared yet") + "."
        kind = "its TOPL head" if self.head["kind"] == "run" else "a probe head fitted on its hidden states"
        auroc = self.head.get("auroc")
        held_out = (
            f"validation token AUROC {auroc:.3f} ({self.head['auroc_source']})"
            if auroc is not None
            else "no validation AUROC recorded"
        )
        return (
            f"Colours: p(good) per token from the adapter's own detector ({kind}, layer {self.head.get('layer')}) — "
            f"not an independent judge; {held_out}. Flagged: p(good) < {FLAG_THRESHOLD:g}."
        )


def doc_path(folder: Path, index: int) -> Path:
    return Path(folder) / f"doc-{index:03d}.json"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def create_deck(folder: str | Path, cfg: DeckConfig) -> Path:
    """Write the deck's config into `folder` (created). The same config again is fine (prepare resumes); another
    deck's config there is refused.

    Example: ``prepare_deck(create_deck("runs/decks/talk", cfg)); show_deck(read_deck("runs/decks/talk"))``"""
    folder = Path(folder)
    old = read_deck(folder)  # an unreadable deck.json is refused, not overwritten: its documents may be another's
    if old is not None and old.config != cfg:
        raise RunError(f"{folder} already holds another deck; choose another deck name (or delete that folder).")
    if old is None:
        write_json(folder / CONFIG_FILE, {"config": cfg.to_json(), "created": time.time()})
    return folder


def read_deck(folder: str | Path) -> Deck | None:
    """The deck in `folder` as far as it is prepared; None where there is no deck.json. A document file that cannot
    be read counts as not prepared, and is named in Deck.unreadable; an unreadable deck.json is a RunError.

    Example: ``deck = read_deck("runs/decks/talk"); deck.done, deck.total, show_deck(deck)``"""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.exists():
        return None
    try:
        cfg = DeckConfig.from_json(json.loads(path.read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSON and UTF-8 decoding errors are ValueErrors
        raise RunError(
            f"{path}: unreadable ({type(e).__name__}: {e}); the deck's settings are lost: delete {folder} and "
            "prepare the deck again."
        ) from e
    docs, unreadable = [], []
    for i, text in enumerate(cfg.documents):
        try:
            docs.append(_read_document(doc_path(folder, i), text))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            docs.append(DeckDocument(text, None, {}))
            unreadable.append((doc_path(folder, i), f"{type(e).__name__}: {e}"))
    return Deck(folder, cfg, _read_json(folder / HEAD_FILE) or {}, tuple(docs), tuple(unreadable))


def _read_document(path: Path, text: str) -> DeckDocument:
    """A document's prepared summaries (none before its file is written); raises on a file that cannot be read."""
    d = json.loads(path.read_text()) if path.exists() else {}
    base, positions = d.get("base"), d.get("positions", {})
    return DeckDocument(
        text, Summary.from_json(base) if base else None, {k: Summary.from_json(v) for k, v in positions.items()}
    )
