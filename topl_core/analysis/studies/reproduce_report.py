"""A reproduction's report, written into the study folder: report.md (its figures linked from figures/), one
self-contained report.html (tables and figures inline; no script, nothing fetched: a deck export's approach,
deck_html.py) and report.json (every table and verdict as data) — each table with the paper's figures beside this
run's (reproduce_tables.py) and a verdict per claim (reproduce_claims.py). This module makes the report's parts (its
sections' display rows, its figures); report_files.py writes the files from them.

    write_report(folder, cfg, results, machine) -> Path     report.md; report.html, report.json and figures/ beside it
    read_report(folder) -> dict                              report.json
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ...foundations.io import atomic_open
from ..lora_a.separability import METHOD
from .paper_numbers import INDICATOR_MODEL
from .report_figures import Series, chart, standalone
from .report_files import Section, render_report
from .reproduce_claims import judge
from .reproduce_config import CONTROL_MODES, VECTOR_MODE, ReproduceConfig
from .reproduce_tables import ReportTables, report_tables
from .verdicts import Comparison, documents_to_settle

# --- what the report shows ----------------------------------------------------------------------------------------

PAPER = f"paper ({INDICATOR_MODEL})"


def _f(x, digits: int = 3, sign: bool = False) -> str:
    """A number as the tables show it ("–" for a missing one)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if not isinstance(x, float):
        return str(x)
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _ci(mean, lo, hi, sign: bool = False) -> str:
    interval = f" [{_f(lo, sign=sign)}, {_f(hi, sign=sign)}]" if math.isfinite(lo) else ""
    return _f(mean, sign=sign) + interval


def _show_training(t: ReportTables) -> list[dict]:
    return [
        {
            "method": r.method,
            "steps": r.steps,
            "examples/step": r.examples_per_step,
            "lr": f"{r.lr:g}",
            "LoRA layers": r.lora_layers,
            "head layer": _f(r.head_layer, 0),
            "train s": _f(r.train_wall_s, 0),
            "median s/step": _f(r.median_s_per_step, 2),
            "tokens/s": _f(r.median_tokens_per_s, 0),
            "loss": f"{_f(r.first_loss)} → {_f(r.final_loss)}",
            "validation": f"{r.val_metric} {_f(r.val_value)}",
        }
        for r in t.training.itertuples()
    ]


def _show_separability(t: ReportTables) -> list[dict]:
    return [
        {
            "method": r.method,
            "sites": r.sites,
            "tokens (bad)": f"{r.tokens} ({r.bad})",
            "LoRA-A AUROC mean ± std": f"{r.mean:.3f} ± {r.std:.3f}",
            "95% CI of mean": f"[{r.ci_low:.3f}, {r.ci_high:.3f}]",
            "random-init A [95% CI]": _ci(r.control_mean, r.control_low, r.control_high),
            PAPER: "–" if math.isnan(r.paper_mean) else f"{r.paper_mean:.4f} ± {r.paper_std:.4f}",
        }
        for r in t.separability.itertuples()
    ]


def _show_factuality(t: ReportTables) -> list[dict]:
    return [
        {
            "model": r.variant,
            "protocol": r.protocol,
            "ID": _f(r.ID),
            "OOD": _f(r.OOD),
            "Δ ID vs base": _ci(r.d_ID, r.d_ID_lo, r.d_ID_hi, sign=True),
            "Δ OOD vs base": _ci(r.d_OOD, r.d_OOD_lo, r.d_OOD_hi, sign=True),
            "sentences, all (OOD)": f"{_f(r.sentences, 2)} ({_f(r.ood_sentences, 2)})",
            "supported sentences (OOD)": _f(getattr(r, "ood_supported", math.nan), 2),
            "documents ID + OOD": f"{int(r.n_ID)} + {int(r.n_OOD)}",
            f"{PAPER} OOD": _f(r.paper_ood, 4),
        }
        for r in t.factuality.itertuples()
    ]


MEASURE_LABELS = {"factuality": "factuality (sentence protocol)", "supported": "supported sentences per summary"}


def _show_pairs(t: ReportTables) -> list[dict]:
    rows = []
    for r in t.pairs.itertuples():
        c = Comparison(r.d, r.d_lo, r.d_hi, r.agree, n=int(r.n))
        settle = documents_to_settle(c)
        rows.append(
            {
                "TOPL against": r.other,
                "measure": MEASURE_LABELS.get(r.measure, r.measure),
                "TOPL − other [95%]": _ci(r.d, r.d_lo, r.d_hi, sign=True),
                "draws with TOPL above": f"{100 * r.agree:.0f}%" if math.isfinite(r.agree) else "–",
                "documents": int(r.n),
                "settled?": "yes" if r.d_lo > 0 or r.d_hi < 0 else "no",
                "documents to settle (80% power)": "–" if settle is None or r.d_lo > 0 or r.d_hi < 0 else f"{settle:,}",
            }
        )
    return rows


def _show_indicator(t: ReportTables) -> list[dict]:
    return [
        {
            "method": r.method,
            "LoRA-A AUROC": r.lora_a_auroc,
            "ID factuality": _f(r.id_factuality),
            "OOD factuality": _f(r.ood_factuality),
            "sentences": _f(r.sentences, 2),
            f"{PAPER} LoRA-A": r.paper_lora_a if isinstance(r.paper_lora_a, str) else "–",
            f"{PAPER} OOD": _f(r.paper_ood, 4),
        }
        for r in t.indicator.itertuples()
    ]


def _show_lambda(t: ReportTables) -> list[dict]:
    return [
        {
            "method": r.run,
            "mode": r.mode,
            "λ": f"{r.lam:g}",
            "factuality [95%]": _ci(r.factuality, r.factuality_lo, r.factuality_hi),
            "change vs neutral λ": _ci(r.change, r.change_lo, r.change_hi, sign=True),
            "degenerate": f"{100 * r.degenerate:.0f}%",
            "perplexity": _f(r.perplexity, 1),
            "sentences": _f(r.sentences, 2),
        }
        for r in t.lambda_curve.rename(columns={"lambda": "lam"}).itertuples()
    ]


def _show_labels(t: ReportTables) -> list[dict]:
    return [
        {
            "setting": r.setting,
            "tokens": r.tokens,
            "% good": _f(r.pct_good, 1),
            "% bad": _f(r.pct_bad, 1),
            "head AUROC (val, original labels)": _f(r.val_token_auroc),
            "head AUROC (CLIFF)": _f(getattr(r, "cliff_token_auroc", None)),
        }
        for r in t.labels.itertuples()
    ]


def _show_detection(t: ReportTables) -> list[dict]:
    """One row per method × token set, a column per detector (the head, the frozen probe, surprisal, then the
    model-free controls of analysis/lexical.py: the lexical control first), each AUROC [95% CI] on the same tokens."""
    if not len(t.detection):
        return []
    rows = []
    for (method, token_set), part in t.detection.groupby(["adapter", "set"], sort=False):
        first = part.iloc[0]
        row = {"method": method, "token set": token_set}
        row |= {r.detector: _ci(r.auroc, r.ci_low, r.ci_high) for r in part.itertuples()}
        rows.append(row | {"tokens": int(first.tokens), "records": int(first.records), "% bad": _f(first.pct_bad, 1)})
    return rows


def _sections(cfg: ReproduceConfig, t: ReportTables, verdicts) -> list[Section]:
    return [
        Section(
            "verdicts",
            "Verdicts",
            "Each claim against this run's figures: reproduced when the claim's direction holds and its 95% "
            "interval excludes the opposite; unsettled when only the point estimate points the claim's way (the why "
            "says how often the bootstrap agrees and how many documents would settle a difference of that size); "
            "not reproduced when the estimate points the other way.",
            [
                {
                    "claim": v.claim,
                    "paper": v.paper,
                    "this run": v.this_run,
                    "verdict": v.verdict,
                    "why": v.why,
                    "source": v.source,
                }
                for v in verdicts
            ],
        ),  # fmt: skip
        Section(
            "training",
            "Training",
            "Every method on the same records and document split, with its paper settings scaled to the model.",
            _show_training(t),
        ),
        Section("separability", "LoRA-A separability", f"{METHOD}", _show_separability(t), "per_layer"),
        Section(
            "factuality",
            "Factuality, ID and OOD",
            f"Summaries of the same {cfg.n_id} ID documents (test split) and {cfg.n_ood} OOD documents by the base "
            f"model and every merged model, scored by {cfg.scorer}; Δ: the paired change against the base model on "
            "the same documents, with its 95% interval. Beside the factuality, the summaries' length (sentences) and "
            "the supported sentences per OOD summary (the sum of its sentences' scores): the sentence protocol's mean "
            "rewards saying less, the count does not.",
            _show_factuality(t),
        ),
        Section(
            "comparisons",
            "TOPL against each method, OOD, paired per document",
            "The OOD factuality of TOPL's merged model minus each other merged model's on the same documents "
            "(sentence protocol), and the same for the supported sentences per summary (the sum of its sentences' "
            "scores: a count that does not reward shorter summaries, where the mean per sentence does); 95% "
            "interval, the share of 2,000 document resamples with TOPL above, and for an unsettled difference the "
            "documents that would settle one of that size with 80% power.",
            _show_pairs(t),
        ),
        Section(
            "indicator",
            "LoRA-A as an indicator of OOD generalization",
            _rho_text(t.rho),
            _show_indicator(t),
            "indicator",
        ),
        Section(
            "lambda_curve",
            "λ curves",
            f"Each method's LoRA-B vector ({VECTOR_MODE}) and the {' and '.join(CONTROL_MODES)} controls (the same "
            "sites, the same length) on the evaluation's documents, sentence protocol; change: paired against the "
            "neutral λ (the merged model); a degenerate text is damage, not a less faithful summary.",
            _show_lambda(t),
            "lambda",
        ),
        Section(
            "labels",
            "Label sensitivity",
            "TOPL on each label setting; every head is scored against the original labels of the validation split "
            "(and CLIFF's spans), so the columns compare what each labelling teaches.",
            _show_labels(t),
        ),
        Section(
            "detection",
            "Token-level detection, held out",
            "Each head method's head against base-model surprisal, the frozen probe (the base model's states at "
            "the head's layer, fitted on the same training records) and three controls that use no model: the "
            "lexical control (the token's word does not occur in the document), a new number or name (a number or "
            "capitalised word absent from the document) and the token's position in the summary — on the same "
            "tokens of the test split and CLIFF's test cut; AUROC [95% CI over records].",
            _show_detection(t),
        ),
    ]


def _rho_text(rho: dict) -> str:
    if not rho or not math.isfinite(rho.get("rho", math.nan)):
        return "Spearman ρ needs at least three methods with both measures."
    return (
        f"Spearman ρ between LoRA-A mean AUROC and OOD factuality over {rho['methods']} methods: {rho['rho']:+.2f} "
        f"(with ID factuality: {rho['rho_id']:+.2f}). Under the intervals — bootstrap draws of every method's sites "
        f"and of the OOD documents, the same documents for every method — ρ lies in [{rho['lo']:+.2f}, "
        f"{rho['hi']:+.2f}] and is positive in {100 * rho['positive']:.0f}% of the draws."
    )


def _figures(t: ReportTables) -> dict[str, str]:
    layers = t.per_layer
    per_layer = [Series(c, list(layers.index), list(layers[c]), dashed=c.startswith("random")) for c in layers]
    lines = []
    for (method, mode), p in t.lambda_curve.groupby(["run", "mode"], sort=False) if len(t.lambda_curve) else ():
        p = p.sort_values("lambda")
        if mode == VECTOR_MODE:
            band = {"lo": list(p["factuality_lo"]), "hi": list(p["factuality_hi"])}
            lines.append(Series(method, list(p["lambda"]), list(p["factuality"]), **band))
        elif method == "topl":  # the controls of the paper's headline curve
            lines.append(Series(f"topl {mode}", list(p["lambda"]), list(p["factuality"]), dashed=True))
    points = [
        Series(r.method, [r.mean], [r.ood_factuality], points=True)
        for r in t.indicator.itertuples()
        if math.isfinite(r.ood_factuality)
    ]
    return {
        "per_layer": chart(per_layer, "LoRA-A AUROC by layer (mean over its sites)", "layer", "AUROC"),
        "lambda": chart(lines, "Factuality against λ (LoRA-B vector, 95% band)", "λ (normalised)", "factuality"),
        "indicator": chart(points, "LoRA-A separability against OOD factuality", "LoRA-A mean AUROC", "OOD"),
    }


# --- the files (report_files.py writes them from the parts) ------------------------------------------------------


def _setup(cfg: ReproduceConfig, results: dict[str, dict], machine: str) -> list[str]:
    """The paragraphs that say what ran, where and for how long."""
    minutes = sum(r.get("seconds", 0.0) for r in results.values()) / 60
    s = cfg.settings
    return [
        f"Model `{cfg.model}`, trained with the per-method settings of the paper's `{s.preset}` preset scaled to it "
        f"(learning rates × {cfg.lr_scale:g}, examples per step × {cfg.batch_scale:g}, heads at lr × "
        f"{cfg.head_lr_multiplier:g}), {cfg.steps} steps each, precision {cfg.precision} on {cfg.device}. Data "
        f"`{cfg.data}`, split by document (seed {cfg.split_seed}); every measure reads the same held-out tokens and "
        f"documents for every method. The paper's figures are those of {INDICATOR_MODEL} after full training: read "
        "this run's against them by direction, not by value.",
        f"Machine: {machine}. Tasks: {len(results)}, {minutes:.1f} min of task time in all (the sum of their wall "
        "times; a study resumed after a stop counts each finished task once).",
    ]


def write_report(folder: str | Path, cfg: ReproduceConfig, results: dict[str, dict], machine: str) -> Path:
    """report.md, report.html, report.json and figures/*.svg in `folder`, from the tasks' results; report.md's path."""
    folder = Path(folder)
    tables = report_tables(cfg, results)
    verdicts = judge(tables)
    figures = _figures(tables)
    (folder / "figures").mkdir(parents=True, exist_ok=True)
    for name, svg in figures.items():
        with atomic_open(folder / "figures" / f"{name}.svg") as f:
            f.write(standalone(svg))
    payload = {"config": cfg.to_json(), "machine": machine, "rho": tables.rho}
    return render_report(folder, cfg, _setup(cfg, results, machine), _sections(cfg, tables, verdicts), figures, payload)


def read_report(folder: str | Path) -> dict:
    """The report's data (report.json): config, machine, verdicts, rho, each section's rows, the figures' names."""
    return json.loads((Path(folder) / "report.json").read_text())
