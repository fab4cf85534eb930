"""What the browser tests share: Debian's Chromium through Playwright, and the app as a learner starts it.

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        with app(tmp_path_factory.mktemp("server")) as url:
            yield url
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from kitchen_viz.launch import free_port, spawn, stop, wait_healthy
from tests.proc_kit import telling

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextmanager
def app(log_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
    """`two-pot-kitchen [args]` on a free port, with `env` set for it (and so its engine's child); yields its URL."""
    with app_process(log_dir, env, args) as (url, _):
        yield url


@contextmanager
def app_process(log_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
    """The same as `app`, yielding (URL, the app's process) for a test that reaches into its processes."""
    log = log_dir / "streamlit.log"
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        proc, url = spawn(free_port(), log, *args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    try:
        with telling(proc, log, "the app"):  # a failing test shows what the app said
            if not wait_healthy(proc, url):
                pytest.fail("the app never became healthy (its log is below)")
            yield url, proc
    finally:
        stop(proc)
