"""A lesson's two orders, served alike: its "compare with" order changed the way its order was.

The lesson plan (kitchen_viz/lessons.py) writes each order for the smallest kitchen; a kitchen
may serve one differently (lesson 2's 4 tables of the longest prompt become 3 under the
instructor's 8,192-token cap). A comparison is even only if the compare order is changed the same
way, so when its link opens the Kitchen, the values both orders ask alike follow what this kitchen
makes of the lesson's order: the same arithmetic as the order form's ceilings (kitchen_viz/orders.py).
"""

from __future__ import annotations

from kitchen_viz.lessons import LONGEST, compare_lesson, compare_like
from kitchen_viz.orders import control_limits, prompt_ceiling, reply_ceiling, tighter


def served_shape(svc, caps, order: dict) -> dict:
    """What the controls make of an order in this kitchen (its ceilings and the instructor's caps).

    Example (the chef, caps 8,192 prompt tokens per order): the longest prompt (2,552 tokens with
    8 new) x 4 tables -> {"prompt": 2552, "batch": 3, "new": 8, "temp": 0.0}."""
    ctx = svc.info.max_context
    new = min(int(order["new"]), tighter(*reply_ceiling(svc.limits, ctx), caps.max_new_tokens, "")[0])
    cap = tighter(*prompt_ceiling(svc.limits, ctx, new), caps.max_order_tokens, "")[0]
    plen = cap if order["prompt"] == LONGEST else max(1, min(int(order["prompt"]), cap))
    most = tighter(control_limits(svc.limits(plen, new), plen, new).max_batch, "",
                   caps.max_order_tokens // max(1, plen) if caps.max_order_tokens else None, "")[0]  # fmt: skip
    return {"prompt": plen, "batch": max(1, min(int(order["batch"]), most)), "new": new,
            "temp": min(max(float(order["temp"]), 0.0), 2.0)}  # fmt: skip


def matched_compare(svc, caps, number: int, lesson) -> tuple[dict, str]:
    """The compare order as this kitchen should cook it, and the line that says why ("" when unchanged)."""
    compare, moved = compare_like(lesson, served_shape(svc, caps, lesson.order))
    if not moved:
        return compare, ""
    return compare, (f"Cooked like lesson {number}'s order, which this kitchen served with {', '.join(moved)}: "
                     "the two orders differ only in what the lesson compares.")  # fmt: skip


__all__ = ["compare_lesson", "matched_compare", "served_shape"]
