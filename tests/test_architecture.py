"""The layering rule of docs/architecture.md, checked on the source: the layer table there is parsed, every import of
a project module is read with `ast`, and the test fails on an import that runs upward, a cycle inside a layer, a
project import hidden in a function (outside the CLI's dispatch), a module the table does not place, or streamlit
imported by the core. Imports under `if TYPE_CHECKING:` count as edges like any other: they never run, but a module
that names another's types depends on it, so a circle they hold apart is still a circle (both checks see them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
# the one deferred import of project modules (see the doc): the CLI imports only the command being run
DEFERRED_OK = {"topl_core.cli"}


def layer_table() -> list[tuple[str, list[str]]]:
    """[(layer name, [module prefixes])] from the doc's table, top layer first. `foundations/` → topl_core.foundations,
    `data/label_settings.py` → topl_core.data.label_settings, `pages/` → pages, `app.py` → app."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        prefixes = []
        for entry in re.findall(r"`([^`]+)`", cells[1]):
            if not (entry.endswith(".py") or entry.endswith("/")):
                continue  # e.g. the UI row's `frame`, `spec`: names inside pages/_ui/
            dotted = entry.removesuffix(".py").removesuffix("__init__").rstrip("/.").replace("/", ".")
            if dotted == "app" or dotted.startswith(("pages", "scripts")):
                prefixes.append(dotted)
            else:
                prefixes.append(f"topl_core.{dotted}" if dotted else "topl_core")
        rows.append((cells[0], prefixes))
    return rows


LAYERS = layer_table()


def layer_of(module: str) -> int | None:
    best = None  # the longest matching prefix wins (pages/_ui/ inside pages/)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            inside = module.startswith(p + ".") and p != "topl_core"  # the package's own __init__ holds no others
            if (module == p or inside) and (best is None or len(p) > len(best[1])):
                best = (i, p)
    return best[0] if best else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> list[Path]:
    return sorted([p for d in ("topl_core", "pages", "scripts") for p in (REPO / d).rglob("*.py")] + [REPO / "app.py"])


def project_imports(path: Path, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a project module in `path` (or in `source`, read
    as if it were that file's)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source)
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):  # `if TYPE_CHECKING:` blocks included: their imports are edges too
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                # `from . import x` / `from pkg import module`: the imported names may be modules themselves
                subs = [f"{target}.{a.name}" for a in child.names]
                out.extend(
                    (s if layer_of(s) is not None and _is_module(s) else target, child.lineno, inner) for s in subs
                )
            visit(child, inner)

    visit(tree, False)
    return [(m, line, inner) for m, line, inner in out if layer_of(m) is not None]


def _is_module(dotted: str) -> bool:
    p = REPO.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def test_the_doc_has_the_layer_table():
    names = [n for n, _ in LAYERS]
    assert names[:3] == ["foundations", "hardware", "data"] and names[-1] == "UI", names


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_only_run_downward(path):
    here = module_name(path)
    assert layer_of(here) is not None, f"{here} is in no layer of {DOC.name}'s table: add it to the right row"
    upward = [
        f"line {line}: {m} ({LAYERS[layer_of(m)][0]})"
        for m, line, _ in project_imports(path)
        if layer_of(m) > layer_of(here)
    ]
    assert not upward, f"{here} ({LAYERS[layer_of(here)][0]}) imports from a layer below it: {upward}"


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_project_imports_sit_at_module_top(path):
    here = module_name(path)
    hidden = [f"line {line}: {m}" for m, line, inner in project_imports(path) if inner]
    if here in DEFERRED_OK:
        return
    assert not hidden, f"{here} imports project modules inside functions (move them to the top): {hidden}"


def import_graph() -> dict[str, set[str]]:
    """module → the project modules it imports at its top (app.py, pages/, scripts/ and topl_core/ alike), those
    under `if TYPE_CHECKING:` included; the CLI's deferred dispatch imports are not edges."""
    graph = {module_name(p): {m for m, _, inner in project_imports(p) if not inner} for p in source_files()}
    return {node: {m for m in targets if m in graph and m != node} for node, targets in graph.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Every group of modules that import each other round (a strongly connected component of more than one module,
    Tarjan's algorithm) as (its modules, sorted; one circle through them, a → … → a), sorted: a failure names them
    all."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted((sorted(group), _circle_through(graph, group)) for group in groups)


def _circle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle from the group's first module back to it, inside the group (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def test_no_import_cycle():
    graph = import_graph()
    assert any(m.startswith("pages") for m in graph) and any(m.startswith("topl_core.") for m in graph)
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"{len(group)} modules ({', '.join(group)}), e.g. {' → '.join(circle)}" for group, circle in cycles
    )


def test_type_checking_imports_are_edges_and_circles_are_found():
    """The checks themselves: an import under `if TYPE_CHECKING:` is read as an edge (at the module's top), and a
    circle whose one side is such an import is found, with nothing else reported."""
    source = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .studies.deck import Deck\n"
    edges = project_imports(REPO / "topl_core" / "analysis" / "token_colors.py", source)
    assert edges == [("topl_core.analysis.studies.deck", 4, False)]
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}}  # a ↔ b and d ↔ e, c outside both
    assert import_cycles(graph) == [(["a", "b"], ["a", "b", "a"]), (["d", "e"], ["d", "e", "d"])]
    three = {"a": {"b"}, "b": {"c"}, "c": {"a", "b"}}
    assert import_cycles(three) == [(["a", "b", "c"], ["a", "b", "c", "a"])]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("path", sorted((REPO / "pages").rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_pages_call_the_core_not_the_cli(path):
    """A page builds a config and calls the core: what the CLI and a page share (data sources, jobs) lives in the
    core, so no page imports topl_core.cli (the layer table alone would allow it: processes sit above the UI)."""
    cli = [
        f"line {line}: {m}"
        for m, line, _ in project_imports(path)
        if m == "topl_core.cli" or m.startswith("topl_core.cli.")
    ]
    assert not cli, f"{module_name(path)} imports the CLI: {cli}"


def test_the_core_never_imports_streamlit():
    for path in (REPO / "topl_core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not any(n.split(".")[0] == "streamlit" for n in names), path


def test_tests_write_outside_the_project_folders():
    """conftest.py's session fixture points the cache and runs folders of every test that names none into a temp
    folder: a test run never leaves results in the user's cache/ or runs/ (only what is shared by link is reused)."""
    from topl_core.foundations.paths import PROJECT_ROOT, cache_dir, runs_dir

    assert not cache_dir().resolve().is_relative_to(PROJECT_ROOT.resolve())
    assert not runs_dir().resolve().is_relative_to(PROJECT_ROOT.resolve())
    assert (cache_dir() / "models").resolve() == (PROJECT_ROOT / "cache" / "models").resolve()  # shared, not remade
