"""The drawn kitchen at projector widths: no label over another, none cut off, key figures large.

The scene's script (kitchen_viz/art/scene.js, as kitchen_viz/scene.py serves it) is mounted alone in
headless Chromium at 1024, 1280, 1366 and 1920 px, presenter mode off and on, and shown the last
moment of an order: a real chef order (measured here), and the widest labels the controls allow
(64 tables x 448 tokens, seconds-long times). Every text's box is measured against every other
and against the ladle, the wok's handle and the lamp (the handle covered the counter's
MB, the ladle the pot's label, the SERVED stamp the ticket's token count).
"""

from __future__ import annotations

import json

import pytest

from engine import Engine
from kitchen_viz.scene import scene_sources
from kitchen_viz.timeline import LiveRun
from lab.units import fmt_s
from tests.browser_kit import chromium, needs_chromium

WIDTHS = (1024, 1280, 1366, 1920)
pytestmark = [pytest.mark.browser, needs_chromium]

PAGE = """<!doctype html><html><head><style>body{{margin:0;font-family:sans-serif}}{css}</style></head>
<body><div id="host"></div><script type="module">
{js}
window.tpkUpdate = (data) => tpkScene({{data, parentElement: document.getElementById("host"), setTriggerValue: () => {{}}}});
window.tpkReady = true;
</script></body></html>"""

# Every box the script measures: the texts that are shown, and the art that once covered them.
MEASURE = """() => {
  const svg = document.querySelector('.tpk-svg');
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const texts = [...svg.querySelectorAll('text')]
    .filter((t) => t.textContent.trim() && getComputedStyle(t).opacity !== '0' && t.getAttribute('opacity') !== '0'
      && t.closest('[opacity="0"]') === null && t.closest('title,desc') === null)
    .map((t) => ({ id: t.id || t.getAttribute('class') + ':' + t.textContent.slice(0, 24), box: box(t),
      group: t.closest('.tpk-ticket, .tpk-table') ? [...t.closest('.tpk-ticket, .tpk-table').parentNode.children]
        .indexOf(t.closest('.tpk-ticket, .tpk-table')) + t.closest('[id]').id : null,
      px: t.getBoundingClientRect().height }));
  const art = ['#tpk-ladle', '#tpk-wok-group > path:first-child', '#tpk-lamp-glow']
    .map((s) => ({ id: s, box: box(svg.querySelector(s)) }));
  return { texts, art, svg: box(svg) };
}"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def open_scene(browser, width: int):
    css, js = scene_sources()
    html = PAGE.format(css=css, js=js.replace("export default function", "const tpkScene = function", 1))
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.set_content(html)
    page.wait_for_function("window.tpkReady === true")
    return page


@pytest.fixture(scope="module")
def chef_order() -> dict:
    """A real order's last moment: 3 tables, 8 new tokens each, measured on this machine."""
    events = list(
        Engine.load("chef").stream(["ROMEO:", "JULIET: the night", "NURSE:"], max_new_tokens=8, seed=0)
    )
    run = LiveRun.for_order("chef", [2, 5, 3])
    run.consume(events)
    return finished(run.scene_data(wok_capacity=4096), kv_per_token=6144)


def finished(data: dict, kv_per_token: int) -> dict:
    data = json.loads(json.dumps(data))
    data.update(
        kv_bytes_per_token=kv_per_token,
        panels=None,
        feed=None,
        slowdown=1e-6,
        slowdown_label="×50 slower than real",
    )
    return data


def widest_order(tables: int = 64, prompt: int = 448, new: int = 64, reused: bool = False) -> dict:
    """The longest labels the controls allow: 64 tables of 448 tokens, slow steps, MBs of cache.
    (Made-up timings: this test measures boxes, not the engine.)"""
    t, step = 1.8765, 0.01234
    steps = [
        [round(t + i * step, 5), round(t + (i + 1) * step, 5), 9_000_000 + i * 400_000]
        for i in range(new - 1)
    ]
    shown = 16
    tokens = [[[t, " Wherefore"]] + [[s[1], " art"] for s in steps] for _ in range(shown)]
    served = [[t, tables]] + [[s[1], tables * (i + 2)] for i, s in enumerate(steps)]
    data = {
        "run_id": f"wide-{tables}",
        "presenter": False,
        "batch": tables,
        "shown_tables": min(tables, shown),
        "prompt_tokens": [prompt] * tables,
        "slots": prompt * tables,
        "mode": "padded",
        "wok_capacity": 448 * 64,
        "prefill": [0.01234, 1.8543],
        "kv_handed": 8_988_000,
        "steps": steps,
        "tokens": tokens[: min(tables, shown)],
        "t_first": t,
        "t_done": steps[-1][1] if steps else t,
        "e2e": steps[-1][1] if steps else t,
        "served": served,
        "wok_tokens": tables if reused else prompt * tables,
        "wok_rate": "15,468 tok/s",
        "reused": (prompt - 1) * tables if reused else 0,
        "summary": {"tpot": "1,234.56 ms", "tps": "22,217 tok/s", "steps": new - 1} if new > 1 else None,
    }
    return finished(data, kv_per_token=12288)


def overlaps(a, b, slack: float = 0.5) -> bool:
    return a[0] + slack < b[2] and b[0] + slack < a[2] and a[1] + slack < b[3] and b[1] + slack < a[3]


def problems(measured: dict) -> list[str]:
    out = []
    texts, svg = measured["texts"], measured["svg"]
    for i, a in enumerate(texts):
        if a["box"][0] < svg[0] - 0.5 or a["box"][2] > svg[2] + 0.5:
            out.append(f"{a['id']} is cut off at the drawing's edge")
        for b in texts[i + 1 :]:
            if overlaps(a["box"], b["box"]):
                out.append(f"{a['id']} overlaps {b['id']}")
        for art in measured["art"]:
            if overlaps(a["box"], art["box"]):
                out.append(f"{a['id']} is under {art['id']}")
    return out


def show(page, data: dict, presenter: bool) -> dict:
    data = dict(data, presenter=presenter, run_id=f"{data['run_id']}-{presenter}")
    page.evaluate("(d) => window.tpkUpdate(d)", data)
    page.wait_for_timeout(300)  # the replay's first frame jumps to its end (slowdown ~0)
    return page.evaluate(MEASURE)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_label_overlaps_or_is_cut_off_at_projector_widths(browser, chef_order, width):
    page = open_scene(browser, width)
    try:
        for data in (chef_order, widest_order(), widest_order(tables=8), widest_order(tables=1, new=1),
                     widest_order(prompt=2032, reused=True), widest_order(tables=8, prompt=2032)):
            for presenter in (False, True):
                found = problems(show(page, data, presenter))
                assert not found, f"{width} px, presenter {presenter}, {data['batch']} tables: {found}"
    finally:
        page.close()


def test_presenter_mode_enlarges_the_drawings_key_figures(browser):
    page = open_scene(browser, 1280)
    try:
        sizes = {}
        for presenter in (False, True):
            m = show(page, widest_order(), presenter)
            sizes[presenter] = {t["id"]: t["px"] for t in m["texts"]}
        for key in ("tpk-wok-rate", "tpk-pot-rate", "tpk-wok-timer", "tpk-pot-timer", "tpk-kv-mb"):
            assert sizes[True][key] > sizes[False][key] * 1.15, key
            assert sizes[True][key] >= 20, (key, sizes[True][key])  # screen px at 1280 wide
    finally:
        page.close()


def test_more_than_eight_tables_are_drawn_and_all_are_counted(browser):
    page = open_scene(browser, 1366)
    try:
        show(page, widest_order(tables=64), False)
        assert page.locator(".tpk-table").count() == 16
        total = page.locator("#tpk-all-tables").text_content()
        assert total == "All 64 tables: 4,096 bowls served · 16 drawn, 48 counted"
        load = page.locator("#tpk-wok-load").text_content()
        assert load == "28,672 prompt tokens (64 tables × 448)"  # the total, then what it is made of
    finally:
        page.close()


def test_a_one_token_order_claims_no_decode_step(browser):
    page = open_scene(browser, 1280)
    try:
        show(page, widest_order(tables=1, new=1), False)
        assert page.locator("#tpk-pot-timer").text_content() == "—"
        assert "no decode step" in page.locator("#tpk-pot-note").text_content()
        # the KV cache arrived on the counter (not left mid-slide over the wok)
        assert page.locator("#tpk-kv-group").get_attribute("transform") == "translate(0 0)"
    finally:
        page.close()


def test_the_first_bowl_is_the_woks_and_the_pot_counts_its_own_steps(browser, chef_order):
    page = open_scene(browser, 1280)
    try:
        show(page, chef_order, False)
        steps = len(chef_order["steps"])
        # The last frame shows the panels' own TPOT and tokens/s, labelled as the mean of the steps.
        assert page.locator("#tpk-pot-note").text_content() == f"mean of {steps} decode steps"
        assert page.locator("#tpk-pot-timer").text_content() == f"TPOT {chef_order['summary']['tpot']}"
        assert page.locator("#tpk-pot-rate").text_content() == chef_order["summary"]["tps"]
        tokens = sum(chef_order["prompt_tokens"])
        assert page.locator("#tpk-wok-note").text_content() == f"{tokens:,} tokens cooked in the pass"
        assert page.locator("#tpk-wok-rate").text_content() == chef_order["wok_rate"]
        pre = chef_order["prefill"]  # the wok's timer is the pass, labelled so (TTFT is the panels')
        assert page.locator("#tpk-wok-timer").text_content() == f"pass {fmt_s(pre[1] - pre[0])}"
    finally:
        page.close()


def test_the_idle_kitchen_has_no_flame_and_no_stray_ladle(browser):
    page = open_scene(browser, 1280)
    try:
        page.evaluate("() => window.tpkUpdate(null)")
        page.wait_for_timeout(100)
        assert (
            page.evaluate("() => getComputedStyle(document.querySelector('#tpk-wok-flames')).opacity") == "0"
        )
        ladle = page.locator("#tpk-ladle").bounding_box()
        pot = page.locator("#tpk-pot-timer").bounding_box()
        assert ladle["x"] > pot["x"]  # in the pot, not in the top-left corner
    finally:
        page.close()


def test_a_long_prefill_ticks_while_the_pass_runs(browser):
    page = open_scene(browser, 1280)
    try:
        data = widest_order()
        data.update(
            t_done=None, e2e=None, prefill=[0.01, None], steps=[], tokens=[[] for _ in range(16)], served=[]
        )
        data["t_first"] = None
        page.evaluate("(d) => window.tpkUpdate(d)", data)
        first = page.locator("#tpk-clock").text_content()
        page.wait_for_timeout(700)
        later = page.locator("#tpk-clock").text_content()
        assert first.startswith("LIVE · wok on for ≥") and later != first
        assert page.locator("#tpk-wok-timer").text_content().startswith("≥ ")
    finally:
        page.close()


LIVE_PANELS = {
    "ttft": "1,234.56 ms",
    "e2e": "—",
    "tpot": "12.34 ms",
    "tps": "22,217 tok/s",
    "latest_itl": "12.30 ms",
    "steps": 120,
    "itl_ms": [12.3] * 120,
    "wait": "waited 512.8 ms in line first",
}

MEASURE_PANELS = """() => [...document.querySelectorAll('.tpk-live-panels .tpk-lp-value, .tpk-live-panels .tpk-lp-label')]
  .map((e) => { const r = e.getBoundingClientRect();
    return {id: e.textContent.slice(0, 30), box: [r.left, r.top, r.right, r.bottom],
            cut: e.scrollWidth > e.clientWidth + 1 || r.right > document.documentElement.clientWidth + 0.5}; })"""


@pytest.mark.parametrize("width", WIDTHS)
def test_the_live_panels_wrap_instead_of_overlapping(browser, width):
    """While cooking, the scene draws the panels itself: '2,217 tok/' was cut at 1400 px."""
    page = open_scene(browser, width)
    try:
        for presenter in (False, True):
            data = widest_order()
            data.update(
                t_done=None, e2e=None, panels=LIVE_PANELS, presenter=presenter, run_id=f"live-{presenter}"
            )
            page.evaluate("(d) => window.tpkUpdate(d)", data)
            page.evaluate(f"() => document.documentElement.style.fontSize = '{22 if presenter else 16}px'")
            page.wait_for_timeout(100)
            boxes = page.evaluate(MEASURE_PANELS)
            assert len(boxes) >= 8
            cut = [b["id"] for b in boxes if b["cut"]]
            assert not cut, (width, presenter, cut)
            crossed = [
                (a["id"], b["id"])
                for i, a in enumerate(boxes)
                for b in boxes[i + 1 :]
                if overlaps(a["box"], b["box"])
            ]
            assert not crossed, (width, presenter, crossed)
    finally:
        page.close()


def test_the_quiet_view_says_it_replays_later_instead_of_looking_hung(browser):
    """With the live view off the page waits without updates: the scene says so (it sat
    on 'waiting for the first measurements…' for the whole order)."""
    page = open_scene(browser, 1280)
    try:
        data = widest_order(tables=2)
        data.update(t_done=None, e2e=None, prefill=None, steps=[], tokens=[[], []], served=[], quiet=True)
        data["t_first"] = None
        page.evaluate("(d) => window.tpkUpdate(d)", data)
        page.wait_for_timeout(100)
        assert page.locator("#tpk-phase").text_content().startswith("Quiet view")
        assert page.locator("#tpk-clock").text_content() == "the kitchen replays it when it is done"
    finally:
        page.close()
