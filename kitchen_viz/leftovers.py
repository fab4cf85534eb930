"""Leftovers on the Kitchen: where an order's reused prompt tokens came from, and an empty counter.

The kitchen keeps the K/V of orders that reuse leftovers after they finish (engine/prefix_cache.py),
and each leftover knows the engine request (a table of an order) that cooked it. This session
remembers its own orders' tables (`remember`), so the page can say whose leftovers an order
reused: one of this learner's earlier orders, or another client's (a student's API request, or
someone else's page). "Clear leftovers" drops this learner's own leftovers, so the Leftovers lesson
can show its "before"; a lesson link that turns reuse on clears them by itself.

Session state: tpk_cooked, this session's finished orders as {"number", "label", "tables",
"kitchen"}; tpk_clear, a pending clear (set by a lesson link, done when the kitchen is at hand).
"""

from __future__ import annotations

import streamlit as st

K_COOKED = "tpk_cooked"
K_CLEAR = "tpk_clear"
KEPT = 50  # orders remembered per session (their tables' ids)


def kitchen_key(svc) -> str:
    return f"{svc.model}/{svc.device}/{svc.dtype}"


def remember(number: int, label: str, result, kitchen: str) -> None:
    """A finished order of this session: its number, its words and its tables' engine request ids."""
    tables = list(getattr(result, "table_ids", ()) or ())
    cooked = st.session_state.setdefault(K_COOKED, [])
    cooked.append({"number": number, "label": label, "tables": tables, "kitchen": kitchen})
    del cooked[:-KEPT]


def source_words(reused_from: list[int], cooked: list[dict], kitchen: str) -> str:
    """Whose leftovers an order reused, in one line ("" when it reused none).

    Example: tables of order #2 -> "from your order #2 (prompt 256 tokens × 4 tables)"; a request
    no order of this page cooked -> "from another client's order (not one of yours)"."""
    if not reused_from:
        return ""
    mine = [c for c in cooked if c["kitchen"] == kitchen and set(c["tables"]) & set(reused_from)]
    theirs = set(reused_from) - {t for c in mine for t in c["tables"]}
    parts = [f"your order #{c['number']} ({c['label']})" for c in mine]
    if theirs:
        parts.append("another client's order (not one of yours)")
    return "from " + " and ".join(parts)


def my_tables(cooked: list[dict], kitchen: str) -> list[int]:
    return [t for c in cooked if c["kitchen"] == kitchen for t in c["tables"]]


def clear_mine(svc) -> int:
    """Drop the leftovers this session's orders left in the kitchen; returns how many orders it asked about."""
    cooked = st.session_state.get(K_COOKED, [])
    tables = my_tables(cooked, kitchen_key(svc))
    if tables:
        svc.clear_leftovers(tables)
    return len([c for c in cooked if c["kitchen"] == kitchen_key(svc)])


def clear_button(svc, disabled: bool) -> None:
    """"Clear leftovers": the next order with Reuse leftovers on starts from an empty counter (as far
    as this learner's orders go: another client's leftovers stay, and the page names them if reused)."""
    if st.session_state.pop(K_CLEAR, False):  # a lesson link asked for an empty counter
        st.session_state["tpk_cleared"] = clear_mine(svc)
    if st.button("Clear leftovers", icon=":material/delete_sweep:", key="tpk-clear-leftovers", disabled=disabled,
                 help="Drop the leftovers your earlier orders left in this kitchen, so the next order with Reuse "
                 "leftovers on cooks every prompt token (another client's leftovers stay)."):  # fmt: skip
        st.session_state["tpk_cleared"] = clear_mine(svc)
    cleared = st.session_state.pop("tpk_cleared", None)
    if cleared is not None:
        st.caption(f"Leftovers cleared: your {cleared} earlier order{'s' if cleared != 1 else ''}' leftovers are gone"
                   if cleared else "Leftovers cleared: no order of yours had left any.")  # fmt: skip


def draw_source(result, svc_key: str) -> None:
    """Under an order that reused leftovers: whose they were."""
    reused = int(getattr(result, "reused_tokens", 0) or 0)
    words = source_words(list(getattr(result, "reused_from", ()) or ()), st.session_state.get(K_COOKED, []), svc_key)
    if reused and words:
        st.caption(f":material/recycling: The {reused:,} reused prompt tokens came {words}.")
