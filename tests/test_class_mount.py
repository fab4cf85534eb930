"""`two-pot-kitchen --class-kitchen`: the app and the class kitchen on one port, as a workshop starts it."""

from __future__ import annotations

import time

import httpx
import pytest
from browser_kit import app, chromium, needs_chromium
from conftest import launched, use_settings

from engine.errors import EngineError
from serving.caps import Caps
from serving.clients.remote_order import board, models, order_remote


def ready(url: str, key: str, timeout_s: float = 120) -> list[dict]:
    """Poll /class/health; returns every answer until the first 200 (the 503s while it loads)."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(url + "/class/health", timeout=5)
        seen.append({"status": r.status_code, "body": r.json()})
        if r.status_code == 200:
            return seen
        time.sleep(0.2)
    pytest.fail(f"the class kitchen never became ready: {seen[-3:]}")


LONG = 1500  # new tokens a table: on a quiet machine the chef cooks it for seconds, so the live rail is seen


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    settings = folder / "settings.toml"  # orders long enough to be watched cooking (the default cap is 512 tokens)
    settings.write_text(f"[caps]\nmax_new_tokens = {LONG}\n")
    with app(folder, args=("--class-kitchen", "--class-key", "k", "--settings", str(settings))) as url:
        yield url


def test_the_class_kitchen_answers_on_the_apps_port(server):
    answers = ready(server, "k")
    assert all(a["status"] == 503 and "loading chef" in a["body"]["error"]["message"] for a in answers[:-1])
    url = server + "/class"
    assert models(url, "k") == ["chef"]
    r = httpx.get(url + "/v1/models")
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]  # the key holds inside the mount
    out = order_remote(url, "chef", "ROMEO:", 8, api_key="k")
    assert out.completion_tokens == 8 and out.server_steps
    snap = board(url, out.order_id, api_key="k")
    assert sum(s["mine"] for s in snap["steps"]) == 8
    assert "twopot:time_to_first_token_seconds" in httpx.get(url + "/metrics").text
    assert httpx.get(server + "/_stcore/health").text == "ok"  # the app itself is unchanged


@needs_chromium
def test_the_class_order_page_orders_from_the_mounted_kitchen(server):
    ready(server, "k")
    with chromium() as b:
        page = b.new_page(viewport={"width": 1280, "height": 3000})
        page.goto(server + "/class_order")
        page.get_by_role("button", name="Order").wait_for(timeout=120_000)
        # the first visit of a fresh server came by a page's link: the app's own menu and controls anyway
        nav = page.locator("[data-testid='stSidebarNav']").inner_text()
        assert "Order from a class kitchen" in nav and "class order" not in nav
        assert page.get_by_text("Model (from the catalog)").count() == 1
        assert page.get_by_label("Kitchen server").input_value().endswith("/class")
        page.get_by_role("button", name="Order").click()
        page.get_by_text("The whole class").wait_for(timeout=120_000)
        page.get_by_text("Class median TTFT", exact=True).wait_for(timeout=30_000)
        page.get_by_text("The pot while your order cooked").wait_for(timeout=30_000)
        assert page.locator("[data-testid='stException']").count() == 0


def generated_tokens(metrics_text: str) -> float:
    line = next(x for x in metrics_text.splitlines() if x.startswith("twopot:generation_tokens_total"))
    return float(line.split()[-1])


@needs_chromium
def test_the_kitchen_cooks_in_the_class_kitchen_and_shows_the_whole_class(server):
    """One code path: the Kitchen's Cook goes to the class kitchen mounted in the app's own process,
    called in process (no HTTP to itself), and its bowls count in the class kitchen's metrics."""
    ready(server, "k")
    before = generated_tokens(httpx.get(server + "/class/metrics").text)
    with chromium() as b:
        page = b.new_page(viewport={"width": 1280, "height": 3000})
        page.goto(server + f"/?batch=2&new={LONG}&prompt=12")
        page.get_by_role("button", name="Cook").wait_for(timeout=120_000)
        assert page.get_by_text("on this server's own kitchen").count() == 1
        page.get_by_role("button", name="Cook").click()
        rail = page.locator(".tpk-class-rail:not([hidden])")  # live, inside the scene, while the order cooks
        rail.filter(has_text="you · #").wait_for(timeout=60_000)  # the board read (a placeholder card before)
        assert rail.inner_text().count("you · #") == 2  # both tables, highlighted as yours
        page.get_by_text("The whole class").wait_for(timeout=120_000)
        page.get_by_text("Class median TTFT", exact=True).wait_for(timeout=30_000)
        page.get_by_text("Diagnosis", exact=False).first.wait_for(timeout=30_000)
        assert page.locator("[data-testid='stException']").count() == 0
    assert generated_tokens(httpx.get(server + "/class/metrics").text) - before == 2 * LONG  # both tables' bowls


def test_other_choices_open_their_own_kitchen_on_demand(server):
    url = server + "/kitchens/chef/cpu/int8"
    assert httpx.get(url + "/kitchen/model").status_code in (401, 503)  # loading, or the key first
    deadline, r = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        r = httpx.get(url + "/kitchen/model", headers={"Authorization": "Bearer k"}, timeout=5)
        if r.status_code == 200:
            break
        assert r.status_code == 503 and "loading chef on cpu (int8)" in r.json()["error"]["message"]
        time.sleep(0.2)
    assert r is not None and r.status_code == 200 and r.json()["info"]["quant"] == "int8"
    assert httpx.get(url + "/kitchen/model").status_code == 401  # the class key holds here too
    r = httpx.get(server + "/kitchens/assets/cpu/float32/kitchen/model")  # catalog names only, never a folder
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("no model 'assets' in this server's catalog")
    r = httpx.get(server + "/kitchens/chef/tpu/float32/kitchen/model")
    assert r.status_code == 404 and r.json()["error"]["message"] == "device must be cpu or cuda[:N] (got 'tpu')"


def test_the_launcher_warns_about_an_open_kitchen_without_a_key(capsys):
    code, s, err = launched(["--class-kitchen", "--server.address", "0.0.0.0"], capsys)
    assert code == 0 and "no --class-key" in err and s.class_model == "chef"
    code, s, err = launched(["--class-kitchen", "preset:smollm2-135m", "--class-key", "s"], capsys)
    assert code == 0 and "no --class-key" not in err
    assert (s.class_model, s.class_key) == ("preset:smollm2-135m", "s")
    assert launched([], capsys)[1].class_model == "chef"  # on by default
    assert launched(["--no-class-kitchen"], capsys)[1].class_model is None
    s = launched(["--backend", "http://10.0.0.5:8000"], capsys)[1]
    assert s.class_model is None and s.backend == "http://10.0.0.5:8000"  # the class pages order from the backend
    code, s, err = launched(["--backend", "http://10.0.0.5:8000", "--class-kitchen"], capsys)
    assert code == 2 and "choose one" in err


def test_the_kitchen_finds_its_kitchen_host_whatever_the_launch(monkeypatch):
    """Where the Kitchen cooks: under the launcher in this process's own kitchens (the class kitchen
    for its own choice, a room of its own otherwise), called in process; without a launcher (plain
    `streamlit run app.py`) in the same rooms opened in process; `--backend` over HTTP."""
    from kitchen_viz import app_state
    from serving.clients.remote import RemoteHost
    from serving.host.api import NotReady
    from serving.host.host import EngineHost
    from serving.http import mounted

    use_settings(monkeypatch, class_model="chef", kitchens=True)
    monkeypatch.setattr(mounted, "_SERVED", [])
    find = app_state.kitchen_host_for("nope", "cpu", "float32")  # nothing mounted: rooms opened here, on first use
    with pytest.raises(EngineError, match="no model 'nope'"):
        find()
    assert mounted.served_here().rooms is not None and mounted.served_here().mount is None  # no class kitchen
    mounted._SERVED.clear()
    class_host = mounted.open_host("chef", mounted.loop_settings("chef", "cpu", "float32"), Caps())
    try:  # the class kitchen's own host, called directly (it says it is loading until it is ready)
        mounted._SERVED.append(mounted.AppHosts(mounted.HostMount(class_host, None), mounted.HostRooms(None)))
        host = app_state.kitchen_host_for("chef", "cpu", "float32")()
        assert host is class_host and isinstance(host, EngineHost)
        with pytest.raises(NotReady, match="loading chef on cpu"):
            host.about()
    finally:
        class_host.close()
    use_settings(monkeypatch, backend="http://10.0.0.5:8000", backend_key="s")
    backend = app_state.kitchen_host_for("chef", "cpu", "float32")
    assert isinstance(backend, RemoteHost) and backend.url == "http://10.0.0.5:8000"


@needs_chromium
def test_a_lab_page_runs_its_sweep_on_the_kitchen_server(server):
    """Under the launcher the Lab, like the Kitchen, is a client of the app's kitchen server, which
    runs the sweep in its engine process (lab/sweeps.py): it ends with its findings."""
    ready(server, "k")
    with chromium() as b:
        page = b.new_page(viewport={"width": 1280, "height": 3000})
        page.goto(server + "/lab_padding")
        guess = page.get_by_placeholder("your guess")
        guess.wait_for(timeout=120_000)
        guess.fill("40")
        guess.press("Enter")
        page.get_by_role("button", name="Run").click()
        page.get_by_text("this machine measured").wait_for(timeout=240_000)
        assert page.locator("[data-testid='stException']").count() == 0
        assert page.locator("[data-testid='stAlertContentError']").count() == 0
