"""A reproduction's report files from its parts (reproduce_report.py makes the parts; reproduce_rejudge.py renders a
saved report's again): report.md (its figures linked from figures/), one self-contained report.html (tables and
figures inline; no script, nothing fetched: a deck export's approach, deck_html.py) and report.json (every section's
rows and the verdicts as data).

    Section(key, title, text, rows, figure="")               one section: its rows as display strings
    render_report(folder, cfg, setup, sections, figures, payload) -> Path   report.md; .html and .json beside it
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from ...foundations.io import atomic_open, write_json
from .reproduce_config import ReproduceConfig
from .verdicts import VERDICTS

NO_NETWORK = "default-src 'none'; style-src 'unsafe-inline'"  # the page loads nothing and runs no script


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    text: str
    rows: list[dict]  # display strings
    figure: str = ""  # the name of its figure in figures/ (no .svg)


CSS = """
body {font-family: ui-sans-serif, system-ui, sans-serif; margin: 1.5rem 2rem; color: #111; background: #fff;
      max-width: 1400px;}
h1 {font-size: 1.7rem;} h2 {font-size: 1.3rem; margin-top: 2rem;}
p {line-height: 1.5;} code {background: #f3f3f3; padding: 0 .25em; border-radius: 3px;}
table {border-collapse: collapse; font-size: .9rem; margin: .6rem 0;}
th, td {border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; vertical-align: top;}
th {background: #f5f5f5;}
td.v-reproduced {background: #dcfce7;} td.v-unsettled {background: #fef9c3;} td.v-not-reproduced {background: #fee2e2;}
td.v-not-measurable-here {background: #f3f4f6;}
"""


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return "_Not measured in this run._"
    cols = list(rows[0])
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(lines + ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows])


def _html_cell(column: str, value) -> str:
    text = html.escape(str(value))
    if column == "verdict" and value in VERDICTS:
        return f'<td class="v-{value.replace(" ", "-")}">{text}</td>'
    return f"<td>{text}</td>"


def _html_table(rows: list[dict]) -> str:
    if not rows:
        return "<p><i>Not measured in this run.</i></p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_html_cell(c, r[c]) for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_report(
    folder: Path,
    cfg: ReproduceConfig,
    setup: list[str],
    sections: list[Section],
    figures: dict[str, str],
    payload: dict,
) -> Path:
    """report.md, report.html and report.json from the report's parts: the setup paragraphs, the sections (their
    rows as display strings; the verdicts' rows the verdicts), the figures' SVG (inline in the HTML, linked from the
    Markdown) and what report.json holds beside them (config, machine, rho)."""
    title = f"Reproducing the paper's tables: {cfg.model}"
    md = [f"# {title}", "", *(p + "\n" for p in setup)]
    page = [f"<h1>{html.escape(title)}</h1>", *(f"<p>{html.escape(p)}</p>" for p in setup)]
    for s in sections:
        md += [f"## {s.title}", "", s.text, "", _md_table(s.rows), ""]
        page += [f'<h2 id="{s.key}">{html.escape(s.title)}</h2>', f"<p>{html.escape(s.text)}</p>", _html_table(s.rows)]
        if s.figure:
            md += [f"![{s.title}](figures/{s.figure}.svg)", ""]
            page.append(f"<figure>{figures[s.figure]}</figure>")
    with atomic_open(folder / "report.html") as f:
        f.write(
            f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
            f'<meta http-equiv="Content-Security-Policy" content="{NO_NETWORK}">\n<style>{CSS}</style></head>\n'
            f"<body>\n{chr(10).join(page)}\n</body></html>\n"
        )
    with atomic_open(folder / "report.md") as f:
        f.write("\n".join(md))
    verdicts = next((s.rows for s in sections if s.key == "verdicts"), [])
    write_json(
        folder / "report.json",
        payload
        | {
            "verdicts": [_verdict_json(v) for v in verdicts],
            "sections": {s.key: s.rows for s in sections},
            "figures": sorted(figures),
        },
    )
    return folder / "report.md"


def _verdict_json(row: dict) -> dict:
    """A verdict row as report.json keeps it (Verdict's fields)."""
    return {"claim": row["claim"], "source": row["source"], "paper": row["paper"], "this_run": row["this run"]} | {
        "verdict": row["verdict"],
        "why": row["why"],
    }
