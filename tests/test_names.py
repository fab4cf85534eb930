"""One name per concept: no two module-level classes of the project share a name.

Every non-test ``.py`` file (the import graph's collector, tests/test_import_graph.py) is parsed with
``ast``. A class declared at module level (also under a module-level ``if`` or ``try``) is a name
the whole project reads; two of them with one name are either one concept written twice (then one
class serves both) or two concepts under one word (then each gets a name that says what it is).
Classes nested in a function or another class are local and not counted.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.test_import_graph import ROOT, project_files


def module_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """The classes a module declares at its own level, including under module-level if / try / with."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.ClassDef):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            todo += node.body + node.orelse
            if isinstance(node, ast.Try):
                todo += node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With):
            todo += node.body
    return found


def class_places(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """Class name -> every "path:line" that declares it at module level."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for cls in module_classes(tree):
            places[cls.name].append(f"{path.relative_to(root).as_posix()}:{cls.lineno}")
    return dict(places)


def shared_names(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    """The class names declared more than once, with where."""
    return {name: where for name, where in class_places(files, root).items() if len(where) > 1}


def test_the_collector_sees_the_project():
    places = class_places(project_files())
    assert places["Engine"] == [p for p in places["Engine"] if p.startswith("engine/engine.py:")] != []
    assert "HostClient" in places and "ClassBoard" in places
    assert not any(p.startswith("tests/") for where in places.values() for p in where)


def test_no_two_module_level_classes_share_a_name():
    shared = shared_names(project_files())
    lines = [f"{name}: {', '.join(where)}" for name, where in sorted(shared.items())]
    assert not shared, "one name per concept; these class names are declared more than once:\n" + "\n".join(lines)


def test_the_finder_names_a_shared_name_and_ignores_local_classes(tmp_path):
    (tmp_path / "a.py").write_text("class Ticket:\n    class Inner: ...\n\nclass Board: ...\n")
    (tmp_path / "b.py").write_text(
        "import sys\nif sys.version_info >= (3, 11):\n    class Ticket: ...\n"
        "def make():\n    class Board: ...\n    return Board\n"
        "class Other:\n    class Inner: ...\n"
    )
    shared = shared_names(sorted(tmp_path.glob("*.py")), tmp_path)
    assert shared == {"Ticket": ["a.py:1", "b.py:3"]}
