"""The layering rule of docs/architecture.md, checked on the source: the layer table there is parsed, every import of
a project module is read with `ast`, and the test fails on an import that runs upward, a cycle inside a layer, a
project import hidden in a function (outside the CLI's dispatch), a module the table does not place, or streamlit
imported by the core. Imports under `if TYPE_CHECKING:` never run: they are no edges."""

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


def project_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of a project module in `path`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue  # `if TYPE_CHECKING:` imports never run: annotations, not edges
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


def _type_checking_only(node: ast.AST) -> bool:
    """An `if TYPE_CHECKING:` block (or `if typing.TYPE_CHECKING:`) with no else."""
    if not isinstance(node, ast.If) or node.orelse:
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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


def test_no_import_cycle():
    graph = {module_name(p): {m for m, _, inner in project_imports(p) if not inner} for p in source_files()}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt) :] + [nxt] if nxt in trail else [node, nxt]
                pytest.fail(f"import cycle: {' → '.join(cycle)}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


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
