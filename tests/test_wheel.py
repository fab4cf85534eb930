"""The wheel is the whole product: built from the checkout, installed into a new environment
outside it, and run from another folder, it cooks, serves the class and shows the Kitchen.

A learner installs with `pip install two-pot-kitchen` (or pipx, uvx) and never sees the checkout,
so every file the app reads at run time must come from its package. The new environment reuses
this one's installed dependencies (a `.pth` line to a folder of links to them, leaving out this
checkout's own editable install), so pip installs only the wheel, in seconds; that every package
the code imports is declared in pyproject.toml is checked on its own, from the imports.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
import time
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import httpx
import pytest
import tomllib

from tests import proc_kit
from tests.browser_kit import chromium, needs_chromium
from tests.test_browser import COOK_TIMEOUT_MS, wait_for_cooked

ROOT = Path(__file__).resolve().parents[1]
MAX_WHEEL_BYTES = 40_000_000  # the chef (20 MB) and the apprentice ride along; the rest is code
RUNTIME_FILES = [  # what the app reads at run time, by its path inside the wheel
    "kitchen_viz/web/app.py",
    "kitchen_viz/web/serve.py",
    "kitchen_viz/web/pages/kitchen.py",
    "kitchen_viz/web/pages/the_pass.py",
    "kitchen_viz/web/.streamlit/config.toml",
    "kitchen_viz/art/scene.js",
    "kitchen_viz/art/kitchen.svg",
    "kitchen_viz/art/favicon.png",  # the tab's icon, served by the app (offline)
    "serving/catalog.toml",
    "engine/native_step.c",
    "engine/native_products.h",
    "engine/native_int8.h",
    "engine/bench/cache_probe.c",
    "engine/models/chef/model.safetensors",
    "engine/models/chef/tokenizer.json",
    "engine/models/apprentice/model.safetensors",
]


def run(cmd: list[str], cwd: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` in `cwd`; a failure or a timeout shows its stderr, so the test says why, not only that."""
    return proc_kit.run(cmd, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)], ROOT, 600)
    (built,) = out.glob("two_pot_kitchen-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new environment outside the checkout with the wheel installed; yields its python."""
    home = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(home / "env")], home, 120, clean_env())
    python = home / "env" / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], home,
                    60, clean_env()).stdout.strip())  # fmt: skip
    # Named site-packages: Streamlit takes a copy of itself outside one for a development checkout.
    overlay = home / "reused" / "site-packages"
    overlay.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("__editable__", "two_pot_kitchen")) and entry.suffix != ".pth":
            (overlay / entry.name).symlink_to(entry)
    (site / "reuse-dependencies.pth").write_text(f"{overlay}\n")
    run([str(python), "-m", "pip", "install", "-q", str(wheel)], home, 900, clean_env())
    return python


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that points back at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | extra


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} never answered")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_the_wheel_holds_the_app_and_nothing_of_the_checkout(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [f for f in RUNTIME_FILES if f not in names] == []
    assert not [n for n in names if n.startswith(("tests/", "docs/", "scripts/", ".ci/"))]
    assert {n.split("/")[0] for n in names if "/" in n} - {"two_pot_kitchen-0.1.0.dist-info"} == {
        "engine", "serving", "kitchen_viz", "lab"}  # fmt: skip
    assert wheel.stat().st_size < MAX_WHEEL_BYTES, f"{wheel.stat().st_size:,} bytes"


def test_installed_engine_cooks_on_the_chef_with_the_native_step(venv, tmp_path):
    where = run([str(venv), "-c", "import engine; print(engine.__file__)"], tmp_path, 60, clean_env()).stdout
    assert str(ROOT) not in where and "site-packages" in where  # the installed package, not the checkout
    info = json.loads(run([str(venv), "-m", "engine", "info", "--model", "chef"], tmp_path, 300, clean_env()).stdout)
    assert info["name"] == "chef" and info["decode_step"].startswith("native"), info["decode_step"]
    out = run([str(venv), "-m", "engine", "generate", "--model", "chef", "--prompt", "ROMEO:", "--max-new-tokens",
               "8", "--json"], tmp_path, 300, clean_env()).stdout  # fmt: skip
    result = json.loads(out)
    assert len(result["tokens"][0]) == 8 and result["texts"][0].strip()


def test_installed_class_kitchen_answers_the_openai_client(venv, tmp_path):
    from openai import OpenAI

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(venv.parent / "two-pot-kitchen"), "serve", "--model", "chef", "--host", "127.0.0.1",
                             "--port", str(port)], cwd=tmp_path, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        with proc_kit.telling(proc, tmp_path / "serve.log", "the installed class kitchen"):
            wait_for(f"http://127.0.0.1:{port}/health", proc)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
            answer = client.completions.create(model="chef", prompt="ROMEO:", max_tokens=8, temperature=0)
            assert answer.choices[0].text.strip() and answer.usage.completion_tokens == 8
    finally:
        stop(proc)
        log.close()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


@pytest.mark.browser
@needs_chromium
def test_installed_app_shows_the_kitchen_and_cooks_in_chromium(venv, tmp_path):
    port = free_port()
    log = (tmp_path / "app.log").open("w")
    proc = subprocess.Popen([str(venv.parent / "two-pot-kitchen"), "--server.port", str(port), "--server.address",
                             "127.0.0.1"], cwd=tmp_path, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        with proc_kit.telling(proc, tmp_path / "app.log", "the installed app"), chromium() as browser:
            wait_for(url + "/_stcore/health", proc)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(url + "/?new=8&batch=2&prompt=32")
            page.get_by_role("button", name="Cook").wait_for(timeout=COOK_TIMEOUT_MS)
            page.get_by_role("button", name="Cook").click()
            wait_for_cooked(page)
            assert page.locator(".tpk-text span").count() >= 1
    finally:
        stop(proc)
        log.close()
    assert "Traceback" not in (tmp_path / "app.log").read_text()


def test_every_package_the_code_imports_is_a_declared_dependency():
    """pip installs what pyproject.toml declares and nothing else, so an import of an undeclared
    package works in this checkout's environment and fails in a learner's."""
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {norm(re.match(r"[A-Za-z0-9_.-]+", d).group()) for d in project["dependencies"]}
    optional = {norm(re.match(r"[A-Za-z0-9_.-]+", d).group()) for ds in project["optional-dependencies"].values()
                for d in ds}  # fmt: skip
    owners = packages_distributions()
    ours = {"engine", "serving", "kitchen_viz", "lab"}
    from_a_checkout = {"conversion"}  # llama.cpp's converter, imported from its own tree (`python -m engine bench peers`)
    missing = {}
    for folder in sorted(ours):
        for file in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - ours - from_a_checkout - set(sys.stdlib_module_names):
                    dists = {norm(d) for d in owners.get(top, [top])}
                    if not dists & declared:
                        missing.setdefault(top, set()).add(file.relative_to(ROOT).as_posix())
    # An optional extra is allowed only for code that says so (a lazy import behind its own command).
    undeclared = {top: files for top, files in missing.items() if not {norm(d) for d in owners.get(top, [top])} & optional}
    assert undeclared == {}, undeclared
