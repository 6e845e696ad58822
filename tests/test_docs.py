"""The docs as a map that does not lie: README.md, docs/*.md and examples/adapters/README.md are read with a CommonMark
parser (markdown-it-py), and

- every relative link and image (markdown and HTML `<img src>`) resolves to a file or folder of the checkout, and a
  link's `#anchor` into a markdown file names one of its headings (GitHub's heading ids);
- every `python -m topl_core …` they show (in a code block or inline code; also `-m topl_core` under `accelerate
  launch` and `.venv/bin/python`) parses with the CLI's own parser (`topl_core.cli.build_parser`): the command exists,
  and so does every flag and its value — an unknown flag fails, as it fails for a user;
- a table that quotes a benchmark JSON of docs/bench shows that JSON's figures (each number, rounded as shown);
- README.md stays short, and its map of docs/ names every file there.

How a doc line becomes an argv (the rule, so that a doc writer can predict it):
- shell syntax is read as a shell reads it (quotes, backslash-newline continuations, `#` comments, `;` `|` `&&`
  `>` end a command); `VAR="…"` lines of a code block are expanded where `$VAR` follows;
- placeholders stand for a value: an ALL-CAPS word (`PATH`, `DIR`, `N`, `LAMBDA`, `-LAMBDA`, `A`), `<word>` and a
  quoted ellipsis (`"..."`); each is given the first of its flag's choices, else `1` (`-1` after a minus);
- an unquoted ellipsis (`…` or `...`) ends the checked part: what follows it is elided, and so may be a required
  argument (the error "arguments are required" / "expected one argument" is then accepted); inside `[ ]` an ellipsis
  only repeats the group (`[--run B …]`) and the brackets are dropped;
- a line without a flag names a command (`python -m topl_core transfer`): that it exists is checked, and missing
  required arguments are accepted; a line whose command is itself a placeholder (`python -m topl_core <command>`)
  names no command to check.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py is not installed (requirements.txt pins it)")

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "adapters" / "README.md"]
README_MAX_LINES = 150

MD = markdown_it.MarkdownIt("commonmark").enable("table")
ELLIPSES = ("…", "...")
SHELL_ENDS = {";", "|", "||", "&", "&&", ">", ">>", "<", ">&", "(", ")"}
PLACEHOLDER = re.compile(r"-?[A-Z][A-Z0-9_]*")


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def tokens_of(path: Path) -> list:
    return MD.parse(path.read_text(encoding="utf-8"))


def inline_children(tokens: list):
    """(child, line) for every inline element of the document, with the line of its block."""
    for tok in tokens:
        if tok.type == "inline":
            for child in tok.children or []:
                yield child, (tok.map[0] + 1 if tok.map else 0)


# --- links -------------------------------------------------------------------------------------------------------


def heading_ids(path: Path) -> set[str]:
    """GitHub's ids of a markdown file's headings: lower-cased text, punctuation dropped, spaces as hyphens, a
    repeated id numbered -1, -2, …"""
    tokens, ids, seen = tokens_of(path), set(), {}
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open":
            continue
        text = "".join(c.content for c in tokens[i + 1].children or [] if c.type in ("text", "code_inline"))
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def links_of(path: Path) -> list[tuple[str, int]]:
    """(target, line) of every link and image in the file, markdown or HTML."""
    tokens, out = tokens_of(path), []
    for child, line in inline_children(tokens):
        if child.type == "link_open":
            out.append((child.attrs.get("href", ""), line))
        elif child.type == "image":
            out.append((child.attrs.get("src", ""), line))
        elif child.type == "html_inline":
            out += [(m, line) for m in re.findall(r"""(?:src|href)=["']([^"']+)["']""", child.content)]
    for tok in tokens:
        if tok.type == "html_block":
            out += [(m, tok.map[0] + 1) for m in re.findall(r"""(?:src|href)=["']([^"']+)["']""", tok.content)]
    return out


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for target, line in links_of(path):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:|//", target):
            continue  # a URL: not checked offline
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root).as_posix()}:{line}: {target}"
        if not dest.exists():
            problems.append(f"{where} → no such file")
        elif not dest.is_relative_to(root):
            problems.append(f"{where} → outside the checkout")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in heading_ids(dest):
            problems.append(f"{where} → no heading with that id in {dest.relative_to(root).as_posix()}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_relative_links_resolve(path):
    assert not (problems := broken_links(path)), "broken links:\n" + "\n".join(problems)


def test_link_check_sees_a_broken_link(tmp_path):
    """The check itself: a missing file, a missing heading and a good link of each kind."""
    (tmp_path / "b.md").write_text("# A title, with `code`\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md) [ok](b.md#a-title-with-code) [ok](b.md#twice-1) [ok](#here) ![ok](b.md) [url](https://x.org)\n\n"
        "# Here\n\n[gone](missing.md) [bad anchor](b.md#nowhere) <img src='nothing.png'>\n"
    )
    problems = broken_links(doc, root=tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md → no such file",
        "b.md#nowhere → no heading with that id in b.md",
        "nothing.png → no such file",
    ]


# --- commands ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # the doc's command line (continuations joined)
    argv: tuple[str, ...]  # what is parsed: placeholders filled, cut at an ellipsis
    elided: bool  # an ellipsis cut the line: missing required arguments are accepted
    note: str = ""  # what is wrong with the line before any parsing


def shell_words(line: str) -> list[str]:
    line = re.sub(r"""(["'])(…|\.\.\.)\1""", "VALUE", line)  # a quoted ellipsis is a placeholder value
    line = re.sub(r"<[^<>\s]+>", "VALUE", line)  # so is `<name>` (a shell would read a redirection)
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote in prose-like inline code
        return line.split()


def commands_in(text: str) -> list[tuple[list[str], bool, str]]:
    """The topl_core argvs of one shell line: (words after `-m topl_core`, cut at an ellipsis, a problem seen)."""
    from topl_core.cli import COMMANDS

    words, out = shell_words(text), []
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "topl_core":
            argv, elided, depth, note = [], False, 0, ""
            for j, w in enumerate(words[i + 2 :], start=i + 2):
                if w in SHELL_ENDS:
                    if w == "|" and words[j + 1 : j + 2] and words[j + 1] in COMMANDS:
                        note = f"`| {words[j + 1]}` pipes into a shell command: write each topl_core command out"
                    break
                opens, closes = len(w) - len(w.lstrip("[")), len(w) - len(w.rstrip("]"))
                depth += opens
                w = w.strip("[]")
                if any(e in w for e in ELLIPSES):
                    if depth == 0:
                        elided = True
                        break
                    w = ""  # `[--run B …]`: the group repeats
                depth = max(0, depth - closes)
                if w:
                    argv.append(w)
            out.append((argv, elided, note))
    return out


def code_lines(content: str) -> list[tuple[int, str]]:
    """A code block's shell lines with their offsets in the block: continuations joined, `VAR=value` lines expanded
    where `$VAR` follows."""
    joined, start, buffer = [], 0, ""
    for i, raw in enumerate(content.splitlines()):
        if not buffer:
            start = i
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        joined.append((start, buffer + raw))
        buffer = ""
    if buffer:
        joined.append((start, buffer))
    env, out = {}, []
    for offset, line in joined:
        for name, value in env.items():
            line = re.sub(rf"\$\{{{name}\}}|\${name}\b", lambda _, v=value: v, line)
        if m := re.fullmatch(r"\s*([A-Za-z_]\w*)=(.*)", line):
            env[m.group(1)] = " ".join(shell_words(m.group(2)))  # unquoted where it is used: it splits
        out.append((offset, line))
    return out


def markdown_commands(text: str, name: str) -> list[DocCommand]:
    """Every topl_core command of a markdown text: in its code blocks (fenced or indented) and its inline code."""
    tokens, found = MD.parse(text), []

    def add(code: str, line: int) -> None:
        for argv, elided, note in commands_in(code):
            found.append(DocCommand(f"{name}:{line}", " ".join(code.split()), tuple(argv), elided, note))

    for tok in tokens:
        if tok.type in ("fence", "code_block"):
            first = tok.map[0] + (2 if tok.type == "fence" else 1)  # the 1-based line of the block's first code line
            for offset, line in code_lines(tok.content):
                add(line, first + offset)
    for child, line in inline_children(tokens):
        if child.type == "code_inline":
            add(child.content, line)
    return found


def fill_placeholders(argv: list[str]) -> list[str] | None:
    """`argv` with each placeholder given a value its flag takes; None when the command itself is a placeholder."""
    from topl_core.cli import COMMANDS, build_parser

    if not argv or PLACEHOLDER.fullmatch(argv[0]):
        return None
    parser = build_parser(argv) if argv[0] in COMMANDS else None
    actions = {}
    if parser is not None:  # every option of the command and of its sub-commands (`data build`)
        stack = [parser]
        while stack:
            p = stack.pop()
            actions.update(p._option_string_actions)
            for a in p._actions:
                if isinstance(a, argparse._SubParsersAction):
                    stack.extend(a.choices.values())
    out, flag = [], None
    for w in argv:
        if w.startswith("--") and "=" in w:
            name, value = w.split("=", 1)
            if PLACEHOLDER.fullmatch(value):
                w = f"{name}={value_for(actions.get(name), value)}"
            flag = None
        elif PLACEHOLDER.fullmatch(w):
            w = value_for(actions.get(flag), w)
        elif w.startswith("-") and not re.fullmatch(r"-\d.*", w):
            flag = w
        out.append(w)
    return out


def value_for(action, placeholder: str) -> str:
    if action is not None and action.choices and placeholder in action.choices:
        return placeholder  # not a placeholder: a value in capitals (`--sets ID OOD`)
    if action is not None and action.choices:
        return str(next(iter(action.choices)))
    return "-1" if placeholder.startswith("-") else "1"


def parse_error(argv: list[str]) -> str | None:
    """The CLI parser's complaint about `argv`, or None when it parses (`--help` included)."""
    from topl_core.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as e:
            if e.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    return None


ELIDED_OK = ("arguments are required", "expected one argument", "expected at least one argument")


def command_problem(cmd: DocCommand) -> str | None:
    if cmd.note:
        return f"{cmd.where}: {cmd.text}\n    {cmd.note}"
    argv = fill_placeholders(list(cmd.argv))
    if argv is None:
        return None
    error = parse_error(argv)
    names_only = not any(w.startswith("-") for w in argv)  # `python -m topl_core transfer` in prose names a command
    if error is None or ((cmd.elided or names_only) and any(s in error for s in ELIDED_OK)):
        return None
    return f"{cmd.where}: {cmd.text}\n    parsed as {argv}: {error}"


COMMAND_LINES = [c for path in DOCS for c in markdown_commands(path.read_text(encoding="utf-8"), rel(path))]


def test_the_docs_show_commands():
    assert len(COMMAND_LINES) > 50, "the command extraction found too little: the docs' code was not read"


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_documented_commands_parse(path):
    problems = [p for c in COMMAND_LINES if c.where.startswith(rel(path) + ":") if (p := command_problem(c))]
    assert not problems, "documented commands the CLI rejects:\n" + "\n".join(problems)


COMMAND_CASES = [  # (markdown, whether the check accepts every command in it)
    ("```bash\npython -m topl_core train --method topl --steps N --out DIR   # placeholders\n```", True),
    ("```bash\npython -m topl_core train --no-such-flag 3\n```", False),
    ("```bash\npython -m topl_core frobnicate --x\n```", False),
    ("```bash\npython -m topl_core train --method nope\n```", False),
    ("```bash\npython -m topl_core transfer --run A [--run B …] --stage dev   # a repeated group\n```", True),
    ('```bash\npython -m topl_core steer --run X --document "..." --lambdas -2 0 2\n```', True),
    ('```bash\nC="--steps 3 \\\n   --batch-size 2"\npython -m topl_core train --out runs/x $C\n```', True),
    ('```bash\nC="--bogus 3"\npython -m topl_core train --out runs/x $C\n```', False),
    ("```bash\npython -m topl_core evaluate --help; python -m topl_core sweep --help\n```", True),
    ("```bash\naccelerate launch --config_file c.yaml -m topl_core train --method sft --micro-batch-size 1\n```", True),
    ("```bash\npython -m topl_core evaluate --sets ID OOD --n-id 2   # capitals that are choices\n```", True),
    ("    python -m topl_core train --steps 3 --bogus\n", False),  # an indented code block
    ("The `python -m topl_core train …` command.", True),
    ("`python -m topl_core <command>`", True),
    ("`python -m topl_core evaluate --scorer hub:nli:<id> --n-id 2`", True),
    ("`python -m topl_core transfer` scores adapters.", True),
    ("`python -m topl_core transfr` scores adapters.", False),
    ("`python -m topl_core probe --bogus`", False),
    ("`python -m topl_core evaluate | sweep`", False),
    ("`python -m topl_core train\n--steps 3 --bogus 1`, inline code across lines", False),
]


@pytest.mark.parametrize("text, ok", COMMAND_CASES)
def test_command_check_rejects_what_the_cli_rejects(text, ok):
    """The check itself, on made-up doc text: an unknown flag, command or choice and commands joined by a pipe fail;
    placeholders, capitals that are choices, an elided tail, a repeated optional group, a variable and a help line
    pass."""
    found = markdown_commands(text, "example.md")
    assert found, "no command found"
    assert [command_problem(c) is None for c in found] == [ok] * len(found), [command_problem(c) for c in found]


# --- figures read from docs/bench ------------------------------------------------------------------------------

# a measured number as a table shows it: not part of a name ("Qwen3-8B", "16x1"); bounds ("≤ 1.05") are dropped first
NUMBER = re.compile(r"(?<![\w.\-−])\d[\d,]*(?:\.\d+)?(?![\w.\-])")
BOUND = re.compile(r"[≤≥<>]\s*\d[\d,.]*")


def json_numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [x for v in value for x in json_numbers(v)]
    return []


def significant_digits(text: str) -> int:
    return len(text.replace(",", "").replace(".", "").lstrip("0"))


def shown(text: str, values: list[float]) -> bool:
    """`text` (e.g. "4,037", "0.223") is one of `values` rounded as the doc rounds it."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    x = float(text.replace(",", ""))
    return any(abs(v - x) <= 0.5 * 10**-decimals + 1e-9 for v in values)


def bench_tables(path: Path):
    """(row, line, cited JSON files) for every table row that cites docs/bench: the row's own links, else the links
    of the paragraph just above its table."""
    tokens, above = tokens_of(path), []
    for i, tok in enumerate(tokens):
        if tok.type == "paragraph_open":
            inline = tokens[i + 1]
            above = [c.attrs["href"] for c in inline.children or [] if c.type == "link_open"]
        elif tok.type == "table_open":
            j = i
            while tokens[j].type != "table_close":
                if tokens[j].type == "tr_open" and tokens[j + 1].type == "td_open":
                    cells, k = [], j
                    while tokens[k].type != "tr_close":
                        if tokens[k].type == "inline":
                            cells.append(tokens[k])
                        k += 1
                    own = [c.attrs["href"] for cell in cells for c in cell.children or [] if c.type == "link_open"]
                    cited = [h for h in (own if any("bench/" in h for h in own) else above) if h.endswith(".json")]
                    files = [(path.parent / h).resolve() for h in cited if "bench/" in h]
                    if files:
                        yield [c.content for c in cells], tokens[j].map[0] + 1, files
                j += 1


def bench_figure_problems(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for cells, line, files in bench_tables(path):
        values = [v for f in files for v in json_numbers(json.loads(f.read_text()))]
        for cell in cells[1:]:  # the first cell names the row
            cell = re.sub(r"`[^`]*`|\[[^\]]*\]\([^)]*\)", "", cell)  # commands and links are not figures
            cell = BOUND.sub("", cell)
            for m in NUMBER.finditer(cell):
                if significant_digits(m.group()) >= 3 and not shown(m.group(), values):
                    names = ", ".join(f.name for f in files)
                    where = f"{path.relative_to(root).as_posix()}:{line}"
                    problems.append(f"{where}: {m.group()} ({cells[0][:50]}) is not in {names}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_bench_figures_are_their_json(path):
    """A table that cites a JSON of docs/bench shows that JSON's figures: every number of 3 or more significant digits
    in it (other than the row's name and a bound such as "≤ 1.05") is one of the JSON's values, rounded as shown."""
    assert not (problems := bench_figure_problems(path)), "figures that their JSON does not hold:\n" + "\n".join(
        problems
    )


def test_bench_check_sees_a_wrong_figure(tmp_path):
    """The check itself: names and bounds are not figures; a figure the JSON lacks is found."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "run.json").write_text(
        json.dumps({"tokens_per_s": 4037.3, "mfu": 0.2231, "rows": [{"g": 28.88}]})
    )
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Measured ([run.json](bench/run.json)):\n\n| what | figure | goal |\n|---|---|---|\n"
        "| Qwen3-8B tokens/s | 4,037 on Llama-3.1-8B | ≥ 1.05 |\n| mfu | 0.223 / 28.9 | — |\n| wrong | 0.224 | — |\n"
    )
    assert bench_figure_problems(doc, root=tmp_path) == ["doc.md:7: 0.224 (wrong) is not in run.json"]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_readme_maps_every_doc():
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve() for t, _ in links_of(README)}
    missing = [rel(p) for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs/ files the README's map does not link: {missing}"
