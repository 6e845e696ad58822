"""Translation, the paper's second task: translate with the base and merged models, score each translation
against its reference, ID on MLQE-PE's test split (the post-edits are the references) and OOD on FLORES+.

    TranslationScorer                      name, score(sources, hypotheses, references) -> list[float] in [0, 1]
    ChrfScorer                             the offline default: sentence chrF (sacrebleu) / 100
    CometScorer(model_id)                  COMET / XCOMET by hub id through the unbabel-comet package (needs a hub)
    make_translation_scorer(name)          "chrf" | "comet:<model id>"
    scorer_agreement(directory, split)     Spearman ρ of the scorer with MLQE-PE's 1 − HTER on its own MT outputs
    mlqe_pairs(directory, split, n)        (source, reference) of an MLQE-PE split with its .pe post-edits
    parallel_pairs(source_file, ref_file)  (source, reference) from two line-aligned UTF-8 files
    flores_pairs(spec, lang_pair, n)       FLORES+ by path (a folder of devtest/<code>.devtest files) or hub id
    evaluate_translation(variants, cfg)    per-sentence rows (text, score) and `translation_table` per variant

Translations are generated greedily with the translation prompt naming both languages (data.encode.instruction)
and cached like the summaries (cache/analysis/translations/).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from ...data.mlqe import load_mlqe_dir
from ...data.records import utf8_lines
from ...foundations.config_fields import config_field
from ...foundations.errors import DataError, ScorerError
from ...foundations.presets import DEFAULT_MODEL, FLORES_CODES, MLQE_PE_PAIRS, language_pair
from ...hardware.precision import PRECISION_HELP, Precision, resolve_precision
from ...inference.generate import GenerationConfig, generate
from ...models.loading import Device
from ...training.adapters import open_adapter
from ..cache import JSON, cached
from .config import Variant
from .documents import hub_rows
from .evaluate import variant_model


class TranslationScorer(Protocol):
    name: str

    def score(self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
        """One quality score in [0, 1] per translation (1 = as good as the reference)."""
        ...


class ChrfScorer:
    """Character n-gram F-score against the reference (sacrebleu's sentence chrF, default settings), / 100."""

    name = "chrf"

    def score(self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
        from sacrebleu.metrics import CHRF

        chrf = CHRF()
        return [chrf.sentence_score(h, [r]).score / 100 for h, r in zip(hypotheses, references)]


@dataclass
class CometScorer:
    """COMET or XCOMET (e.g. "Unbabel/wmt22-comet-da", "Unbabel/XCOMET-XL") through unbabel-comet: source-,
    hypothesis- and reference-aware. Needs the package (pip install unbabel-comet) and a hub for the weights."""

    model_id: str

    @property
    def name(self) -> str:
        return f"comet:{self.model_id}"

    def score(self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
        try:
            from comet import download_model, load_from_checkpoint
        except ImportError as e:
            raise ScorerError(
                f"{self.name}: the unbabel-comet package is not installed (pip install unbabel-comet), or use the "
                "offline default 'chrf'."
            ) from e
        try:
            model = load_from_checkpoint(download_model(self.model_id))
        except Exception as e:  # no hub here, an unknown or gated id
            raise ScorerError(f"{self.name}: could not load the model ({type(e).__name__}: {e}).") from e
        data = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hypotheses, references)]
        return [min(1.0, max(0.0, float(x))) for x in model.predict(data, progress_bar=False).scores]


def make_translation_scorer(name: str = "chrf") -> TranslationScorer:
    if name == "chrf":
        return ChrfScorer()
    if name.startswith("comet:") and name.removeprefix("comet:"):
        return CometScorer(name.removeprefix("comet:"))
    raise ScorerError(f"translation scorer {name!r}: use 'chrf' (offline) or 'comet:<hub model id>'.")


# --- data -------------------------------------------------------------------------------------------------------


def mlqe_pairs(directory: str | Path, split: str = "test", n: int | None = None) -> list[tuple[str, str]]:
    """(source, post-edit) of the first n sentences of an MLQE-PE split (its {split}.pe file is required)."""
    records = load_mlqe_dir(directory, split)
    if records and "reference" not in records[0].meta:
        raise DataError(
            f"{directory}: no {split}.pe next to {split}.src — the post-edits are the references a translation is "
            "scored against. Use the WMT20 task 2 release, which has them."
        )
    return [(r.document, r.meta["reference"]) for r in records[:n]]


def parallel_pairs(source_file: str | Path, reference_file: str | Path, n: int | None = None) -> list[tuple[str, str]]:
    """(source, reference) from two line-aligned UTF-8 files (one sentence per line)."""
    sources = [line.rstrip("\r") for _, line in utf8_lines(source_file)]
    references = [line.rstrip("\r") for _, line in utf8_lines(reference_file)]
    if len(sources) != len(references):
        raise DataError(
            f"{source_file} has {len(sources)} lines, {reference_file} {len(references)}: parallel files need one "
            "sentence per line, aligned."
        )
    return list(zip(sources, references))[:n]


def flores_pairs(spec: str, lang_pair: str, n: int | None = None, split: str = "devtest") -> list[tuple[str, str]]:
    """FLORES+ (source, reference) for a pair: from a folder laid out as FLORES releases are
    (`{spec}/{split}/{code}.{split}`, e.g. devtest/eng_Latn.devtest), or from a hub dataset id (its config per
    language, column "text")."""
    codes = []
    for lang in language_pair(lang_pair):
        if lang not in FLORES_CODES:
            raise DataError(f"no FLORES+ code for language {lang!r}; known: {sorted(FLORES_CODES)}.")
        codes.append(FLORES_CODES[lang])
    folder = Path(spec) / split
    if folder.is_dir():
        return parallel_pairs(*(folder / f"{code}.{split}" for code in codes), n=n)
    if Path(spec).exists():
        raise DataError(f"{spec}: expected a FLORES folder with {split}/{codes[0]}.{split} and {codes[1]}.{split}.")
    fix = "Give a FLORES folder or two parallel files."
    source, target = ([row["text"] for row in hub_rows(spec, fix, code, split)] for code in codes)
    return list(zip(source, target))[:n]


def scorer_agreement(
    directory: str | Path, split: str = "test", scorer: str = "chrf", n: int | None = None
) -> dict[str, float | int | str]:
    """How the scorer agrees with MLQE-PE's human sentence quality: Spearman ρ between its scores of the split's own
    machine translations (against the post-edits) and 1 − HTER (the {split}.hter file: the share of words a
    translator changed). A reference-based scorer reads the same post-edit that HTER is computed from, so a high ρ
    is expected: it checks the scorer's direction and resolution, not an independent judgement."""
    from scipy.stats import spearmanr

    records = load_mlqe_dir(directory, split)[:n]
    path = Path(directory) / f"{split}.hter"
    if not path.is_file() or (records and "reference" not in records[0].meta):
        raise DataError(f"{directory}: scorer agreement needs {split}.hter and {split}.pe beside {split}.src.")
    try:
        hter = [float(line) for _, line in utf8_lines(path) if line.strip()][: len(records)]
    except ValueError as e:
        raise DataError(f"{path}: every line must be one HTER value, a number in [0, 1] ({e}).") from e
    if len(hter) != len(records):
        raise DataError(f"{path}: {len(hter)} HTER lines for {len(records)} sentences; one per sentence.")
    made = make_translation_scorer(scorer)
    scores = made.score(
        [r.document for r in records], [r.response for r in records], [r.meta["reference"] for r in records]
    )
    rho = spearmanr(scores, 1 - np.asarray(hter)).statistic if len(records) > 2 else float("nan")
    return {"scorer": made.name, "spearman": float(rho), "n": len(records)}


# --- evaluation -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranslationConfig:
    lang_pair: str = config_field(
        "en-de", label="Language pair", help=f"source-target; MLQE-PE's word-level pairs: {MLQE_PE_PAIRS}"
    )
    model: str = config_field(DEFAULT_MODEL, label="Base model", help="the base model when no adapter names one")
    device: Device = config_field("cpu", label="Device", help="where the variants translate")
    scorer: str = config_field(
        "chrf", label="Scorer", help="'chrf' (offline) or 'comet:<hub id>' (needs the unbabel-comet package)"
    )
    max_new_tokens: int = config_field(
        96, label="Max new tokens", help="the longest translation, in tokens", min=8, max=1024
    )
    batch_size: int = config_field(8, label="Batch size", help="sentences translated together", min=1, max=256)
    # resolved for `device` when built (topl_core.hardware.precision)
    precision: Precision = config_field("auto", label="Precision", help="of the translations: " + PRECISION_HELP)

    def __post_init__(self) -> None:
        language_pair(self.lang_pair)  # raises on a malformed pair
        object.__setattr__(self, "precision", resolve_precision(self.precision, self.device))

    @property
    def generation(self) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            max_doc_tokens=None,
            batch_size=self.batch_size,
            precision=self.precision,
        )


@dataclass(frozen=True)
class TranslationJob:
    """A translation evaluation to run in the background (topl_core.jobs.launchers.launch_translation): the base model
    (include_base) and each run merged, on MLQE-PE (ID: `mlqe` folder, `split`) and FLORES+ or parallel files (OOD)."""

    cfg: TranslationConfig
    runs: tuple[str, ...] = ()
    include_base: bool = True
    mlqe: str | None = None
    split: str = "test"
    flores: str | None = None
    ood_src: str | None = None
    ood_ref: str | None = None
    n_id: int = 16
    n_ood: int = 16

    def __post_init__(self) -> None:
        if not self.mlqe and not self.flores and not self.ood_src:
            raise ValueError("no sentences: give an MLQE-PE split folder (ID), FLORES+ or parallel files (OOD)")
        if not self.runs and not self.include_base:
            raise ValueError("nothing to evaluate: pick an adapter or keep the base model row")


def translate(variant: Variant, sources: Sequence[str], cfg: TranslationConfig, use_cache: bool = True) -> list[str]:
    """The variant's translation of each source sentence (base or merged model; cached)."""
    if variant.kind == "steered":
        raise ValueError("translation evaluates base and merged models; steer on the Steering page.")
    adapter = open_adapter(variant.run) if variant.run else None
    key = {
        "model": None if adapter else (variant.model or cfg.model),
        "lang_pair": cfg.lang_pair,
        "device": cfg.device,
        "sources": hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16],
        "n": len(sources),
        "generation": asdict(cfg.generation),
    }

    def compute() -> list[str]:
        lm = variant_model(variant, cfg.model, cfg.device, cfg.generation.precision)
        return generate(lm, sources, cfg.generation, task="translation", lang_pair=cfg.lang_pair)

    return cached("translations", key, compute, JSON, adapter=adapter, enabled=use_cache)


def evaluate_translation(
    variants: Sequence[Variant],
    id_pairs: Sequence[tuple[str, str]],
    ood_pairs: Sequence[tuple[str, str]] = (),
    cfg: TranslationConfig = TranslationConfig(),
    use_cache: bool = True,
):
    """Per-sentence rows (variant, set, source, reference, text, score) for every variant on the ID and OOD pairs."""
    import pandas as pd

    if not id_pairs and not ood_pairs:
        raise DataError("no sentences to translate: give ID (MLQE-PE) or OOD (FLORES+) pairs.")
    scorer = make_translation_scorer(cfg.scorer)
    rows = []
    for v in variants:
        for name, pairs in (("ID", id_pairs), ("OOD", ood_pairs)):
            if not pairs:
                continue
            sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
            texts = translate(v, sources, cfg, use_cache)
            for s, r, t, x in zip(sources, references, texts, scorer.score(sources, texts, references)):
                rows.append({"variant": v.name, "set": name, "source": s, "reference": r, "text": t, "score": x})
    return pd.DataFrame(rows).assign(scorer=scorer.name)


def translation_table(per_sentence):
    """Per variant (first-seen order): mean score on ID and OOD, their average, and the sentence counts."""
    import pandas as pd

    out = []
    for name, part in per_sentence.groupby("variant", sort=False):
        means = {s: part[part["set"] == s]["score"].mean() for s in ("ID", "OOD")}
        present = [m for s, m in means.items() if (part["set"] == s).any()]
        out.append(
            {
                "variant": name,
                "ID": means["ID"],
                "OOD": means["OOD"],
                "average": sum(present) / len(present),
                "n_ID": int((part["set"] == "ID").sum()),
                "n_OOD": int((part["set"] == "OOD").sum()),
            }
        )
    return pd.DataFrame(out).set_index("variant")
