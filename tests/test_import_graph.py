"""The project's imports point one way.

Every non-test ``.py`` file is parsed with ``ast``; every import in it (module level, inside a
function, under ``if TYPE_CHECKING:``) that names a project file is an edge of a file-level graph.
The rules, each a test that names what breaks it:
- no cycle between files (a function-local import closes a cycle as surely as a top-level one);
- ``engine/`` imports nothing of the project outside ``engine/``, and the inference code never imports
  its bench (``engine/bench/``: only the command line, ``engine/cli.py``, reaches it);
- a function-local import carries its reason on its line: ``# lazy: <why it is loaded late>``;
- packages import downward only: entry points (kitchen_viz/web/: app.py, serve.py, pages/; scripts/, docs/) ->
  kitchen_viz/ -> lab/ -> serving/ -> engine/.

Importing ``a.b`` is an edge to ``a/b.py`` only, not to ``a/__init__.py``: a package's ``__init__``
re-exports its modules, so counting it would make every package a cycle with itself.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"tests", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"}
LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")
LAYERS = ["kitchen_viz", "lab", "serving", "engine"]  # each imports only those after it
ENTRY = "kitchen_viz/web/"  # the Streamlit entry (app.py, serve.py) and its pages: entry points


@dataclass(frozen=True)
class Import:
    """One import statement that names a project file."""

    source: str  # the importing file, relative to the root
    target: str  # the imported file, relative to the root
    line: int
    local: bool  # inside a function body


def project_files(root: Path = ROOT) -> list[Path]:
    """Every non-test Python file of the project."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]  # never walk .venv
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(files)


def module_index(files: list[Path], root: Path = ROOT) -> dict[str, str]:
    """Dotted module name -> file (relative), for every file reachable as a module from the root."""
    index = {}
    for path in files:
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            index[".".join(parts)] = rel.as_posix()
    return index


def _resolve(name: str, index: dict[str, str]) -> str | None:
    """The file that ``import name`` runs last: the module itself, else its nearest package."""
    parts = name.split(".")
    while parts:
        hit = index.get(".".join(parts))
        if hit is not None:
            return hit
        parts = parts[:-1]
    return None


def _targets(node: ast.AST, rel: str, index: dict[str, str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for alias in node.names if (t := _resolve(alias.name, index))]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = list(Path(rel).with_suffix("").parts)[:-1]  # a file's package, __init__ or not
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = []
    for alias in node.names:
        sub = index.get(f"{base}.{alias.name}")  # `from pkg import module`
        target = sub or _resolve(base, index)
        if target:
            found.append(target)
    return found


class _Collector(ast.NodeVisitor):
    def __init__(self, rel: str, index: dict[str, str]):
        self.rel, self.index = rel, index
        self.depth = 0
        self.imports: list[Import] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target in dict.fromkeys(_targets(node, self.rel, self.index)):
            if target != self.rel:
                self.imports.append(Import(self.rel, target, node.lineno, self.depth > 0))

    visit_Import = visit_ImportFrom = _import


def local_imports_without_reason(root: Path = ROOT) -> list[str]:
    """Function-local imports (of anything) whose lines carry no ``# lazy: <reason>``."""
    bad = []
    for path in project_files(root):
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source, filename=rel)
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                text = "\n".join(lines[node.lineno - 1 : (node.end_lineno or node.lineno)])
                if not LAZY_REASON.search(text):
                    bad.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(set(bad))


def project_imports(root: Path = ROOT) -> list[Import]:
    files = project_files(root)
    index = module_index(files, root)
    found: list[Import] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        collector = _Collector(rel, index)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=rel))
        found.extend(collector.imports)
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    """The graph's strongly connected components of more than one file (Tarjan), each as a cycle."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the project's file count
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return [_one_cycle(graph, comp) for comp in components]


def cycle_report(found: list[list[str]], imports: list[Import]) -> str:
    """Each cycle as `a -> b -> a`, then the lines that make its edges (what to change)."""
    where = {(i.source, i.target): f"{i.source}:{i.line}{' (local)' if i.local else ''}" for i in imports}
    return "\n".join(
        " -> ".join(c) + "\n    " + ", ".join(where[(a, b)] for a, b in zip(c, c[1:], strict=False)) for c in found
    )


def _one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest closed path through the component's first file, for a readable failure."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component  # unreachable for a strongly connected component


def test_the_collector_sees_the_project():
    imports = project_imports()
    sources = {imp.source for imp in imports}
    assert {"engine/engine.py", "kitchen_viz/web/serve.py", "kitchen_viz/web/app.py"} <= sources
    assert any(imp.local for imp in imports), "function-local imports must be seen, not only top-level ones"


def test_no_import_cycle_between_files():
    imports = project_imports()
    found = cycles(imports)
    assert not found, "import cycles (a -> b -> ... -> a), each with its imports:\n" + cycle_report(found, imports)


def test_engine_imports_nothing_of_the_project_outside_engine():
    bad = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in project_imports()
        if imp.source.startswith("engine/") and not imp.target.startswith("engine/")
    ]
    assert not bad, "engine/ must stand alone:\n" + "\n".join(bad)


def test_packages_import_downward_only():
    def layer(rel: str) -> int:
        top = rel.split("/")[0]
        if rel.startswith(ENTRY):  # the Streamlit entry and its pages: above every package
            return -1
        return LAYERS.index(top) if top in LAYERS else -1  # an entry point: above every package

    bad = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in project_imports()
        if layer(imp.target) < layer(imp.source) or (layer(imp.target) == -1 and layer(imp.source) >= 0)
    ]
    assert not bad, "an import against the layers (" + " -> ".join(LAYERS) + "):\n" + "\n".join(bad)


def test_the_engine_never_loads_its_bench():
    bad = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in project_imports()
        if imp.source.startswith("engine/") and not imp.source.startswith("engine/bench/")
        and imp.target.startswith("engine/bench/") and imp.source != "engine/cli.py"
    ]
    assert not bad, "the bench is built on the engine, not inside it:\n" + "\n".join(bad)


def test_function_local_imports_say_why():
    bad = local_imports_without_reason()
    assert not bad, "a function-local import needs `# lazy: <reason>` on its line:\n" + "\n".join(bad)


def test_the_cycle_finder_names_a_cycle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from pkg.c import x  # lazy: test\n")
    (tmp_path / "pkg" / "c.py").write_text("from . import a\nx = 1\n")
    (tmp_path / "pkg" / "d.py").write_text("def g():\n    import json\n")
    found = cycles(project_imports(tmp_path))
    assert found == [["pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/a.py"]]
    assert local_imports_without_reason(tmp_path) == ["pkg/d.py:2: import json"]


def test_no_source_file_outside_the_tests_is_over_400_lines():
    """One file per concept, about 100-350 lines: a file past 400 holds several concepts."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    sizes = {p: len((ROOT / p).read_text().splitlines()) for p in tracked.stdout.split() if not p.startswith("tests/")}
    assert sizes and {p: n for p, n in sizes.items() if n > 400} == {}
