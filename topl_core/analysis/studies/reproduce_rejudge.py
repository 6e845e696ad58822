"""A saved reproduction report judged again by the current claims (reproduce_claims.py), without its study folder:
the tables a verdict reads are parsed back from report.json's display rows, the detection table gets the model-free
controls (analysis/lexical.py) on the very tokens it scored — recomputed from the data and the base model's tokenizer
alone, checked token count by token count — and the report is rendered again with every other section as it was.
What the saved rows do not hold stays unmeasured and says so: the per-document scores behind a paired comparison
(a difference of two methods' factuality is then read from their intervals against the base model, as if independent:
wider than the paired interval) and the supported sentences per summary.

    tables_from_report(report) -> ReportTables          the tables the claims read, from report.json
    detection_with_controls(report, cfg) -> (DataFrame, notes)   the saved detection rows + the controls' rows
    rejudge_report(folder, note="") -> Path              report.md / .html / .json rewritten in place
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ...data.records import read_jsonl
from ...foundations.paths import project_path
from ...models.loading import ModelSpec, load_model
from ..lexical import CONTROLS
from .detection_stats import DETECTORS, bootstrap_auroc, control_arrays
from .report_files import render_report
from .reproduce_claims import judge
from .reproduce_config import ReproduceConfig
from .reproduce_report import _sections, read_report
from .reproduce_tables import ReportTables
from .transfer import load_cliff, stage_sets
from .verdicts import documents_to_settle, from_intervals, se_of

NUMBER = r"[-+]?\d+(?:\.\d+)?"
KEPT = ("training", "separability", "factuality", "indicator", "lambda_curve", "labels")  # shown as they were saved


def _number(text) -> float:
    m = re.search(NUMBER, str(text))
    return float(m.group()) if m and str(text).strip() not in ("–", "") else math.nan


def _interval(text) -> tuple[float, float, float]:
    """'0.604 [0.593, 0.616]' → (0.604, 0.593, 0.616); '[0.593, 0.616]' → (nan, 0.593, 0.616); NaN where absent."""
    text = str(text)
    inside = re.search(rf"\[({NUMBER}), ({NUMBER})\]", text)
    lo, hi = (float(inside.group(1)), float(inside.group(2))) if inside else (math.nan, math.nan)
    head = text.split("[")[0]
    return _number(head) if head.strip() else math.nan, lo, hi


def tables_from_report(report: dict) -> ReportTables:
    """The tables the claims read, parsed back from report.json's display rows (three decimals, as shown)."""
    sec = report["sections"]
    t = ReportTables(rho=dict(report.get("rho") or {}))
    rows = []
    for r in sec.get("separability", []):
        mean, std = (_number(x) for x in r["LoRA-A AUROC mean ± std"].split("±"))
        _, lo, hi = _interval(r["95% CI of mean"])
        control, control_lo, control_hi = _interval(r["random-init A [95% CI]"])
        rows.append(dict(method=r["method"], mean=mean, std=std, ci_low=lo, ci_high=hi, control_mean=control))
        rows[-1].update(control_low=control_lo, control_high=control_hi)
    t.separability = pd.DataFrame(rows)
    rows = []
    for r in sec.get("factuality", []):
        d_ood, d_lo, d_hi = _interval(r["Δ OOD vs base"])
        sentences = re.findall(NUMBER, r["sentences, all (OOD)"])
        n_id, n_ood = (int(x) for x in re.findall(r"\d+", r["documents ID + OOD"]))
        rows.append(dict(variant=r["model"], protocol=r["protocol"], ID=_number(r["ID"]), OOD=_number(r["OOD"])))
        rows[-1].update(d_OOD=d_ood, d_OOD_lo=d_lo, d_OOD_hi=d_hi, n_ID=n_id, n_OOD=n_ood)
        rows[-1].update(sentences=float(sentences[0]), ood_sentences=float(sentences[1]), ood_supported=math.nan)
    t.factuality = pd.DataFrame(rows)
    cfg = report.get("config", {})
    documents = int(cfg.get("n_id", 0)) + int(cfg.get("n_ood", 0)) or None  # the λ curves' documents
    rows = []
    for r in sec.get("lambda_curve", []):
        f, f_lo, f_hi = _interval(r["factuality [95%]"])
        change, c_lo, c_hi = _interval(r["change vs neutral λ"])
        rows.append(dict(run=r["method"], mode=r["mode"], factuality=f, factuality_lo=f_lo, factuality_hi=f_hi))
        rows[-1].update({"lambda": _number(r["λ"]), "change": change, "change_lo": c_lo, "change_hi": c_hi})
        rows[-1]["factuality_n"] = documents if documents else math.nan
    t.lambda_curve = pd.DataFrame(rows)
    t.labels = pd.DataFrame(
        [{"setting": r["setting"], "val_token_auroc": _number(r["head AUROC (val, original labels)"])} for r in
         sec.get("labels", [])]
    )  # fmt: skip
    t.detection = _saved_detection(sec.get("detection", []))
    return t


def _saved_detection(rows: list[dict]) -> pd.DataFrame:
    """The detection rows, long (adapter, set, detector, auroc, ci_low, ci_high, tokens, records, pct_bad), from
    either layout a report saved: one row per detector, or one column per detector."""
    out = []
    for r in rows:
        common = dict(adapter=r["method"], set=r["token set"], tokens=int(r["tokens"]), records=int(r["records"]))
        common["pct_bad"] = _number(r["% bad"])
        cells = {r["detector"]: r["AUROC [95% CI]"]} if "detector" in r else {
            k: v for k, v in r.items() if k not in ("method", "token set", "tokens", "records", "% bad")
        }  # fmt: skip
        for detector, cell in cells.items():
            auroc, lo, hi = _interval(cell)
            out.append(common | dict(detector=detector, auroc=auroc, ci_low=lo, ci_high=hi))
    return pd.DataFrame(out)


def detection_with_controls(report: dict, cfg: ReproduceConfig) -> tuple[pd.DataFrame, list[str]]:
    """The saved detection rows and, for each token set whose tokens the data and the base model's tokenizer give back
    exactly (the same count), the model-free controls' rows with the same record-bootstrap CI (1,000 resamples, seed
    0, as transfer draws them). Notes name the sets that could not be matched."""
    saved = _saved_detection(report["sections"].get("detection", []))
    if not len(saved):
        return saved, []
    saved = saved[~saved["detector"].isin(list(CONTROLS))]  # a report judged before: its controls computed again
    labelled = [r for r in read_jsonl(project_path(cfg.data)) if r.token_labels_known]
    cliff, notes = load_cliff(cfg.cliff_csv)
    sets = stage_sets(cfg.split_seed, "heldout", labelled, cliff, cfg.detection_records)
    template = cfg.train_config("topl")
    tokenizer = load_model(ModelSpec(cfg.model)).tokenizer
    rows = []
    for name, part in saved.groupby("set", sort=False):
        if name not in sets:
            notes.append(f"detection: token set {name} not found in the data; no controls for it")
            continue
        t = control_arrays(tokenizer, sets[name], template.max_doc_tokens, template.max_response_tokens)
        if len(t["bad"]) != int(part["tokens"].iloc[0]):
            notes.append(f"detection: {name} gives {len(t['bad'])} tokens, the report scored {part['tokens'].iloc[0]}")
            continue
        cis = bootstrap_auroc(t["bad"], {c: t[c] for c in CONTROLS}, t["record"], 1000, 0)
        for adapter in dict.fromkeys(part["adapter"]):
            first = part[part["adapter"] == adapter].iloc[0]
            rows += [first.to_dict() | {"detector": c, **cis[c]._asdict()} for c in CONTROLS]
    order = {d: i for i, d in enumerate(dict.fromkeys([*DETECTORS, *saved["detector"]]))}  # transfer's order first
    table = pd.concat([saved, pd.DataFrame(rows)], ignore_index=True) if rows else saved
    keys = {k: i for i, k in enumerate(dict.fromkeys(zip(saved["adapter"], saved["set"])))}
    table = table.assign(_k=[keys[(a, s)] for a, s in zip(table["adapter"], table["set"])])
    table = table.assign(_d=table["detector"].map(order)).sort_values(["_k", "_d"], kind="stable")
    return table.drop(columns=["_k", "_d"]).reset_index(drop=True), notes


def _setup(report_md: str) -> list[str]:
    """The report's setup paragraphs, as report.md holds them (between the title and the first section)."""
    head = report_md.split("\n## ", 1)[0].split("\n", 1)[1]
    return [p.strip() for p in head.split("\n\n") if p.strip()]


APPROXIMATE = (
    "The OOD factuality of TOPL's merged model minus each other merged model's (sentence protocol). The per-document "
    "scores were not kept with this report, so the difference's interval comes from the two methods' paired "
    "intervals against the base model, taken as independent — wider than the paired interval, so the documents "
    "needed to settle it (80% power) are an upper estimate. The supported sentences per summary need those scores "
    "too: not measured here."
)


def approximate_pairs(t: ReportTables) -> list[dict]:
    """The comparisons section from a report's saved intervals: TOPL − each other merged model, OOD, sentence
    protocol, with the normal approximation's share and the documents that would settle it."""
    f = t.factuality
    rows = f[(f["protocol"] == "sentence") & (f["variant"] != "base")].set_index("variant") if len(f) else None
    if rows is None or "topl" not in rows.index:
        return []
    topl, out = rows.loc["topl"], []
    for other, r in rows.drop(index="topl").iterrows():
        ses = [se_of(topl.d_OOD_lo, topl.d_OOD_hi), se_of(r.d_OOD_lo, r.d_OOD_hi)]
        c = from_intervals(float(topl.OOD - r.OOD), ses, int(topl.n_OOD))
        settled = c.lo > 0 or c.hi < 0
        n = documents_to_settle(c)
        out.append(
            {
                "TOPL against": other,
                "measure": "factuality (sentence protocol)",
                "TOPL − other [95%, from the intervals]": f"{c.estimate:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]",
                "TOPL above (normal approximation)": f"{100 * c.agree:.0f}%",
                "documents": c.n,
                "settled?": "yes" if settled else "no",
                "documents to settle (80% power)": "–" if settled or n is None else f"{n:,}",
            }
        )
    return out


def _columns(report_md: str) -> dict[str, list[str]]:
    """Each section's table columns, by the section's title, from report.md."""
    out = {}
    for part in report_md.split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        header = next((line for line in body.splitlines() if line.startswith("| ")), "")
        out[title.strip()] = [c.strip() for c in header.strip().strip("|").split(" | ")] if header else []
    return out


def _inline(svg: str) -> str:
    return svg.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)


def rejudge_report(folder: str | Path, note: str = "") -> Path:
    """Rewrite the report in `folder` with the current claims' verdicts, the detection controls and the current
    sections' wording; `note` (what was re-derived, when, how) is added to the setup paragraphs. Returns report.md."""
    folder = Path(folder)
    report = read_report(folder)
    cfg = ReproduceConfig.from_json(report["config"])
    tables = tables_from_report(report)
    tables.detection, notes = detection_with_controls(report, cfg)
    verdicts = judge(tables)
    # the sections' wording and the rows of what is rebuilt (verdicts, detection); the rest as saved
    sections = _sections(cfg, ReportTables(rho=tables.rho, detection=tables.detection), verdicts)
    saved, md = report["sections"], (folder / "report.md").read_text(encoding="utf-8")
    columns = _columns(md)  # report.json keeps each row's keys sorted: the column order is report.md's
    for s in sections:
        if s.key in KEPT:
            order = columns.get(s.title, [])
            rows = [{c: r[c] for c in order if c in r} | r for r in saved.get(s.key, [])]
            s.rows[:] = [_with_columns(s.key, r) for r in rows]
        if s.key == "comparisons":  # no per-document scores kept: the comparisons from the saved intervals
            sections[sections.index(s)] = replace(s, text=APPROXIMATE, rows=approximate_pairs(tables))
    setup = [p for p in _setup(md) if not p.startswith("Re-judged")]
    setup += [p for p in [note, *notes] if p]
    figures = {name: _inline((folder / "figures" / f"{name}.svg").read_text()) for name in report.get("figures", [])}
    payload = {k: report[k] for k in ("config", "machine", "rho") if k in report}
    return render_report(folder, cfg, setup, sections, figures, payload)


def _with_columns(key: str, row: dict) -> dict:
    """A saved row with the columns the current report adds ('–': not in the saved tables)."""
    if key != "factuality" or "supported sentences (OOD)" in row:
        return row
    out = {}
    for k, v in row.items():
        out[k] = v
        if k == "sentences, all (OOD)":
            out["supported sentences (OOD)"] = "–"
    return out
