"""The environment variables the code reads are the ones docs/architecture.md lists, each with its reader.

Settings travel as one object (serving/app_settings.py `AppSettings`); what remains in the
environment are test hooks, cache locations, the native build's overrides and one handoff. Every string literal `TWO_POT_...` in the
project's packages is collected with `ast` and must be in the document's table, which names the
file that reads it; a variable the table lists must still be read there."""

from __future__ import annotations

import ast
import re

from tests.test_import_graph import ROOT, project_files

DOC = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"^TWO_POT_[A-Z0-9_]+$")


def read_by_code() -> dict[str, set[str]]:
    """Variable -> the package files whose code names it (docstrings and comments aside)."""
    found: dict[str, set[str]] = {}
    for path in project_files():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(("engine/", "serving/", "lab/", "kitchen_viz/")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef |
                      ast.FunctionDef | ast.AsyncFunctionDef) and n.body and isinstance(n.body[0], ast.Expr)}  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and NAME.match(node.value):  # fmt: skip
                found.setdefault(node.value, set()).add(rel)
    return found


def documented() -> dict[str, tuple[str, str]]:
    """Variable -> (the file the document says reads it, its kind)."""
    block = re.search(r"<!-- env-vars -->(.*?)<!-- /env-vars -->", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has no <!-- env-vars --> table"
    rows = re.findall(r"^\| `(TWO_POT_[A-Z0-9_]+)` \| ([\w/.]+\.py) \| ([\w ]+) \|", block.group(1), re.M)
    return {name: (reader, kind) for name, reader, kind in rows}


def test_the_documented_variables_are_exactly_the_ones_the_code_reads():
    code, doc = read_by_code(), documented()
    assert set(code) == set(doc), f"read but not listed: {set(code) - set(doc)}; listed but not read: {set(doc) - set(code)}"
    for name, (reader, _) in doc.items():
        assert reader in code[name], f"{name}: the document says {reader} reads it; the code: {sorted(code[name])}"


def test_no_setting_travels_in_the_environment():
    """Test hooks, cache locations, the native build's overrides and one handoff: the app's settings are
    AppSettings (serving/app_settings.py), the engine's EngineSettings (engine/settings.py)."""
    kinds = {kind for _, kind in documented().values()}
    assert kinds <= {"test hook", "cache location", "build override", "handoff"}, kinds
