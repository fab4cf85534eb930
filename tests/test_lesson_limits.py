"""The order form's ceilings follow the kitchen the order cooks in, and their words add up.

A shared kitchen's seat can be shorter than the model's context (SmolLM2 reads 8,192 tokens; the
app's kitchens seat 4,097), and its seats, not its memory, can cap the batch: the controls stop
where the engine would stop, and a help text's numbers divide to the ceiling it explains.
"""

from __future__ import annotations

from engine.request_group import order_room
from engine.serving_core import ServingLimits
from kitchen_viz.orders import control_limits, prompt_ceiling, reply_ceiling

KV_PER_TOKEN = 18_432  # SmolLM2-135M's K/V bytes per token in float32 (30 layers x 3 heads x 64 x 2 x 4 / ...)


def smollm2_kitchen(seats: int = 41, kv_tokens: int = 420_000):
    """A kitchen shaped like the app's for SmolLM2: 4,096-slot seats, a model context of 8,192."""
    shape = ServingLimits(seats, 4096, kv_tokens, 0, 0, 0)
    return lambda prompt, new: order_room(shape, 8192, KV_PER_TOKEN, prompt, new)


def test_the_prompt_control_stops_at_the_seat_not_the_models_context():
    limits = smollm2_kitchen()
    cap, reason = prompt_ceiling(limits, 8192, 8)
    assert cap == 4097 - 8  # prompt + reply may reach the seat's length + 1 (order_room)
    assert "KV seat" in reason and "4,097" in reason and "8,192" in reason
    new_cap, new_reason = reply_ceiling(limits, 8192)
    assert new_cap == 4096 and "KV seat" in new_reason
    assert limits(cap, 8).max_batch >= 1  # the ceiling itself cooks


def test_when_the_seats_cap_the_batch_the_help_names_the_seats():
    lim = smollm2_kitchen()(200, 200)
    assert lim.max_batch == 41  # the memory would hold 420,000 // 400 = 1,050
    words = control_limits(lim, 200, 200).batch_reason
    assert "41 KV seats" in words and "MB" not in words


def test_when_memory_caps_the_batch_its_numbers_divide_to_the_ceiling():
    lim = smollm2_kitchen(seats=64, kv_tokens=10_000)(200, 200)
    words = control_limits(lim, 200, 200).batch_reason
    assert lim.max_batch == 25 and "25 tables fit" in words
    per_table = float(words.split("needs ")[1].split(" MB")[0])
    budget = float(words.split("budget is ")[1].split(" MB")[0].replace(",", ""))
    assert int(budget / per_table) == lim.max_batch
