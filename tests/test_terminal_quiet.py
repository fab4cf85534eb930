"""The server's terminal stays readable for the class: a Lab sweep that profiles the pot
(lab/overhead.py) prints no torch profiler line, and no page calls a Streamlit API that warns it is
deprecated (each warning repeats at every rerun of every session). The browser side, a launched
app's log after cooking, is tests/test_class_pages_browser.py."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Keyword arguments Streamlit deprecated (it warns once per call): width="stretch" / "content" replace them.
DEPRECATED_KEYWORDS = {"use_container_width", "use_column_width"}


def test_a_profiled_run_prints_no_profiler_line():
    code = ("from engine import Engine; from lab.overhead import profiled_run; "
            "e = Engine.load('chef'); profiled_run(e, ['ROMEO:'], 4, {}, False); print('profiled')")  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "profiled" in out.stdout, out.stderr[-2000:]
    noise = [line for line in (out.stdout + out.stderr).splitlines() if "profiler_st" in line or "USDT" in line]
    assert not noise, noise


def test_no_page_uses_a_deprecated_streamlit_keyword():
    found = []
    for path in [*(REPO / "kitchen_viz").rglob("*.py"), *(REPO / "lab").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg in DEPRECATED_KEYWORDS:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.arg}")
    assert not found, found
