"""The Kitchen's order form: what a learner may order, read from the model's limits, and the Cook row.

`order_ui()` draws the controls and returns an `Order` when Cook was pressed. Every ceiling comes
from the engine (`Engine.limits`: context and KV budget) and the instructor's caps, never from a
figure written here; a value that no longer fits (after another control moved, or because a link
asked for it) is moved inside and the page says which way and why.

Session state this form keeps: the controls' values (tpk_mode, tpk_text, tpk_prompt_len,
tpk_batch, tpk_new, tpk_temp, tpk_live, tpk_reuse) and what a link set (tpk_from_url).
"""

from __future__ import annotations

import os

import streamlit as st

from engine.errors import EngineError
from kitchen_viz import live_feed
from kitchen_viz.app_state import APP_DIR
from kitchen_viz.order_control import is_cooking, order_caps, say_refused
from kitchen_viz.orders import (
    DEFAULT_PROMPT,
    Order,
    control_limits,
    prompt_ceiling,
    reply_ceiling,
    tighter,
)
from kitchen_viz.wok_win import Rates, rates_from, wok_win_order
from serving.host.api import OrderForm
from serving.host_client import HostClient

LESSONS_PAGE = "pages/lessons.py"
K_MODE, K_TEXT, K_PLEN, K_BATCH, K_NEW, K_TEMP = (
    "tpk_mode",
    "tpk_text",
    "tpk_prompt_len",
    "tpk_batch",
    "tpk_new",
    "tpk_temp",
)
MODES = ("Generated prompt of N tokens", "Write a prompt")
K_LIVE = "tpk_live"
K_REUSE = "tpk_reuse"  # the learner's choice: start from leftovers (off: the wok cooks every prompt token)
K_WOK_WIN = "tpk_wok_win"  # set by "Make the wok win": the next run cooks the order it sized
LONGEST = "longest"  # ?prompt=longest: the longest prompt this model and kitchen take (a lesson's long prompt)
LIVE_VIEW_MIN_CORES = 4


# A shared link can preset the order: ?prompt=32&batch=4&new=16&temp=0.7 (applied once per session).
# A value outside the controls' limits is moved inside them and the page says which way and why,
# exactly as when a control moves (see `clamp_state`).
QUERY_KEYS = {
    "prompt": (K_PLEN, int),
    "batch": (K_BATCH, int),
    "new": (K_NEW, int),
    "temp": (K_TEMP, float),
    "live": (K_LIVE, lambda v: v not in ("0", "false", "no")),
    "reuse": (K_REUSE, lambda v: v not in ("0", "false", "no")),
}
K_FROM_URL = "tpk_from_url"  # {session key: "?name=value"} for values the link set, until first shown
K_LIVE_KEEP = "tpk_live_keep"  # the learner's live-view choice, kept while the toggle is not drawn
K_FORM_HIDDEN = "tpk_form_hidden"  # set while the loading page stands in for the order form
URL_ORDER = {K_PLEN: "prompt", K_BATCH: "batch", K_NEW: "new", K_TEMP: "temp"}


def apply_query_params() -> None:
    """Seed the order form from the URL once, so an instructor can hand out a ready-made order.

    A link from the lesson plan (`?lesson=N&...`, pages/lessons.py) applies again in a session that
    already applied one: each lesson's marker is applied once."""
    lesson = st.query_params.get("lesson")
    if st.session_state.get("tpk_query_applied") and lesson in (None, st.session_state.get("tpk_lesson")):
        return
    st.session_state["tpk_query_applied"] = True
    st.session_state["tpk_lesson"] = lesson
    if lesson is not None and "prompt" in st.query_params:
        st.session_state[K_MODE] = MODES[0]  # a lesson's prompt is a generated one of N tokens
    if lesson is not None:
        st.session_state[K_REUSE] = False  # only the Leftovers lesson (?reuse=1) turns reuse on
    st.session_state[K_FROM_URL] = {}
    for name, (key, kind) in QUERY_KEYS.items():
        if name in st.query_params:
            raw = st.query_params[name]
            if name == "prompt" and raw == LONGEST:  # moved down to the ceiling without a warning
                st.session_state[key] = 10**9
                st.session_state[K_FROM_URL][key] = None
                continue
            try:
                value = kind(raw)
            except ValueError:
                st.warning(f"Ignored ?{name}={raw}: not a number.")
                continue
            st.session_state[key] = value
            st.session_state[K_FROM_URL][key] = f"?{name}={raw}"
            if key == K_LIVE:
                st.session_state[K_LIVE_KEEP] = value


def keep_order_in_url() -> None:
    """Write the order's current values to the address bar, so a reload (or a copied link) keeps it."""
    for key, name in URL_ORDER.items():
        if key in st.session_state:
            value = st.session_state[key]
            text = f"{value:g}" if isinstance(value, float) else str(value)
            if st.query_params.get(name) != text:
                st.query_params[name] = text


def live_view_default() -> bool:
    """Live by default where it measured inside the 3 % TPOT budget; quiet (wait, then replay)
    elsewhere. The toggle overrides either way.

    Against the quiet view on a 2-core machine (docs/benchmarks/ui-overhead.md), the live view
    following the feed's stream (what `two-pot-kitchen` serves) stays inside the 3 % TPOT budget;
    updated through fragment reruns (plain `streamlit run app.py`) it does not, so there it is the
    default only with 4 or more cores, where the browser need not share the engine's.
    """
    return live_feed.serving() or (os.cpu_count() or 1) >= LIVE_VIEW_MIN_CORES


def clamp_state(key: str, default, low, high) -> str | None:
    """A widget's value kept inside its (changing) range: "raised", "lowered", or None if it fit."""
    value = st.session_state.get(key, default)
    clamped = min(max(value, low), high)
    st.session_state[key] = clamped
    if clamped == value:
        return None
    return "raised" if clamped > value else "lowered"


def say_clamped(key: str, what: str, moved: str | None, value, why_low: str, why_high: str) -> None:
    """One warning naming the value's source (the link's ?name=value, or the control), the
    direction it moved and the limit that moved it. Example: "?batch=0 raised to 1: an order needs
    at least one table."."""
    from_url = st.session_state.get(K_FROM_URL, {})
    source = from_url.get(key)
    if moved is None or (key in from_url and source is None):  # None: the link asked for the ceiling itself
        return
    shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
    st.warning(f"{source or what} {moved} to {shown}: {why_low if moved == 'raised' else why_high}.")


SLIDER_MAX = 4096  # above this a slider cannot be set to one token: the control becomes a number box


def count_control(label: str, low: int, high: int, key: str, help: str) -> int:
    """A slider for ranges a hand can set precisely; a number box (typed, or stepped) beyond that."""
    if high - low <= SLIDER_MAX:
        return st.slider(label, low, max(low + 1, high), key=key, help=help)
    return st.number_input(label, min_value=low, max_value=high, step=1, key=key, help=help)


def order_ui(svc: HostClient, seed: int) -> Order | None:
    """The order form: three columns of controls, then the Cook row. Returns an Order when Cook
    was pressed (`start_cook` has the engine check it).

    Every ceiling comes from the engine (`Engine.limits`: context and KV budget), and a control
    never offers an order that cannot cook (orders.reply_ceiling / prompt_ceiling); a value that no
    longer fits after another control moved (or that a link asked for) is moved inside, and the
    reason is shown. A refused written prompt keeps every control in place (Cook disabled), so the
    layout does not jump while the learner fixes it.
    """
    ctx = svc.info.max_context
    apply_query_params()
    prompt_col, batch_col, new_col = st.columns([5, 4, 4], gap="medium")
    caps = order_caps()  # the instructor's caps: the controls stop there too, not only Cook's check
    with new_col:
        new_cap, new_reason = tighter(
            *reply_ceiling(svc.limits, ctx),
            caps.max_new_tokens,
            f"the instructor's limit is {caps.max_new_tokens:,} new tokens per order",
        )
        moved = clamp_state(K_NEW, min(64, new_cap), 1, new_cap)
        max_new = count_control(
            "Max new tokens (bowls per table)",
            1,
            new_cap,
            K_NEW,
            help=f"Up to {new_cap:,}: {new_reason}.",
        )
        say_clamped(K_NEW, "Max new tokens", moved, max_new, "a table gets at least one token", new_reason)
        moved = clamp_state(K_TEMP, 0.0, 0.0, 2.0)
        temperature = st.slider(
            "Temperature", 0.0, 2.0, step=0.05, key=K_TEMP, help="0 = greedy (always the likeliest token)."
        )
        say_clamped(
            K_TEMP, "Temperature", moved, temperature, "0 is greedy, the lowest", "2 is the highest offered"
        )
    with prompt_col:
        text, plen = prompt_ui(svc, max_new, caps.max_order_tokens)
    refusal = None
    with batch_col:
        if text is not None:
            if not text.strip():
                refusal = "the prompt is empty (only spaces or line breaks): write at least one word"
            else:
                try:
                    plen = len(svc.check(OrderForm([text], max_new)).prompt_ids[0])
                except EngineError as err:
                    refusal = str(err)
            if refusal:
                say_refused(refusal)
                plen = 1  # the batch control stays in place, at the limits of the shortest prompt
            else:
                st.caption(f"Your prompt is {plen:,} tokens.")
        lim = control_limits(svc.limits(plen, max_new), plen, max_new)
        most, why = tighter(
            lim.max_batch,
            lim.batch_reason,
            caps.max_order_tokens // max(1, plen),
            f"the instructor's limit is {caps.max_order_tokens:,} prompt tokens per order, all tables "
            f"together, and each table orders {plen:,}",
        )
        moved = clamp_state(K_BATCH, 1, 1, most)
        batch = st.slider("Tables ordering at once (batch size)", 1, max(2, most), key=K_BATCH)
        st.caption(f"Up to {most:,}: {why}.")
        say_clamped(K_BATCH, "Batch", moved, batch, "an order needs at least one table", why)
    with st.container(horizontal=True, vertical_alignment="center", gap="medium", key="tpk-cook-row"):
        pressed = st.button(
            "Cook",
            type="primary",
            icon=":material/local_fire_department:",
            disabled=is_cooking() or refusal is not None,
            key="tpk-cook",
        )
        pressed = st.session_state.pop(K_WOK_WIN, False) or pressed  # "Make the wok win" cooks at once
        # The toggle's state is dropped by any run that does not draw it (the loading page after a
        # model or precision switch), and the default may not be what this session showed (it is
        # decided by modules a file change reloads): what the toggle showed last is kept instead.
        # (Measured in Chromium: after the loading page the toggle's state came back *False*, not
        # missing, so the kept value is restored whenever the form was hidden, not only when absent.)
        if st.session_state.pop(K_FORM_HIDDEN, False) or K_LIVE not in st.session_state:
            st.session_state[K_LIVE] = st.session_state.get(K_LIVE_KEEP, live_view_default())
        st.session_state[K_LIVE_KEEP] = st.toggle(
            "Live view",
            key=K_LIVE,
            help="On: the panels and the kitchen update 4× a second while the engine cooks, then the "
            "kitchen replays the order in slow motion. The engine runs in its own process and the kitchen "
            "follows its own stream of updates, so watching costs the pot little (the budget is 3 % of TPOT; "
            "docs/benchmarks/ui-overhead.md has what it measured). Off: the page waits quietly and "
            "replays the order when it is done.",
        )
        reuse = st.toggle(
            "Reuse leftovers",
            key=K_REUSE,
            help="Off (the default): the wok cooks every prompt token of the order, so the same order "
            "measures the same every time. On: in a kitchen that keeps leftovers (the class kitchen "
            "`two-pot-kitchen` runs), a prompt that starts like one cooked a moment ago takes those tokens' "
            "KV cache from the leftovers instead of cooking them (prefix caching), and the "
            "panels, the drawing and the diagnosis say how many tokens were reused.",
        )
        wok_win_button(svc, caps, disabled=is_cooking())
        if (APP_DIR / LESSONS_PAGE).is_file():
            st.page_link(LESSONS_PAGE, label="Suggested orders (lesson plan)", icon=":material/menu_book:")
    st.session_state[K_FROM_URL] = {}  # a link's values are explained once; later moves are the controls'
    keep_order_in_url()
    if not pressed or refusal is not None:
        return None
    return Order(
        batch,
        max_new,
        temperature,
        seed,
        text=text,
        prompt_tokens=None if text is not None else plen,
        reuse_prefix=bool(reuse),
    )


def measured_rates() -> Rates | None:
    """The rates the session's last finished order measured (None before one finished)."""
    run = st.session_state.get("tpk_run")
    result = getattr(run, "result", None)
    if result is None:
        return None
    return rates_from(result.metrics, "your last order")


def wok_win_button(svc: HostClient, caps, disabled: bool) -> None:
    """One click: an order sized so the wok wins on this machine (kitchen_viz/wok_win.py), set in the
    controls and cooked at once."""
    ctx = svc.info.max_context
    most_new, _ = tighter(*reply_ceiling(svc.limits, ctx), caps.max_new_tokens, "")

    def longest(new: int) -> int:
        cap, _ = tighter(*prompt_ceiling(svc.limits, ctx, new), caps.max_order_tokens, "")
        return cap

    plan = wok_win_order(longest, most_new, measured_rates())

    def choose() -> None:  # a callback: it sets the controls before they are drawn again
        st.session_state.update({K_MODE: MODES[0], K_PLEN: plan.prompt, K_BATCH: plan.batch, K_NEW: plan.new})
        st.session_state[K_WOK_WIN] = True

    st.button(
        "Make the wok win",
        icon=":material/whatshot:",
        key="tpk-wok-win",
        disabled=disabled,
        on_click=choose,
        help=f"Cooks {plan.prompt:,} prompt tokens × {plan.batch} table × {plan.new} new tokens: {plan.why}.",
    )


def prompt_ui(
    svc: HostClient, max_new: int, order_tokens: int | None = None
) -> tuple[str | None, int | None]:
    """A written prompt (text, None) or a generated one of N tokens (None, N)."""
    mode = st.radio("Prompt", MODES, key=K_MODE, horizontal=True, label_visibility="collapsed")
    if mode == MODES[1]:
        text = st.text_area("Prompt text (every table orders this)", DEFAULT_PROMPT, key=K_TEXT, height=90)
        return text, None
    cap, reason = tighter(
        *prompt_ceiling(svc.limits, svc.info.max_context, max_new),
        order_tokens,
        f"the instructor's limit is {order_tokens:,} prompt tokens per order, all tables together"
        if order_tokens
        else "",
    )
    moved = clamp_state(K_PLEN, min(32, cap), 1, cap)
    plen = count_control(
        "Prompt length (tokens per table)",
        1,
        cap,
        K_PLEN,
        help="Each table's order is this many tokens of kitchen verse, cut at a different line.",
    )
    st.caption(f"Up to {cap:,}: {reason}.")
    say_clamped(K_PLEN, "Prompt length", moved, plen, "a prompt has at least one token", reason)
    return None, plen
