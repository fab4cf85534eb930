"""The lesson's pure logic: a compare order matched to its lesson's order, the wok's tosses in
words, and whose leftovers an order reused."""

from __future__ import annotations

from kitchen_viz.leftovers import source_words
from kitchen_viz.lessons import LESSONS, compare_lesson, compare_like
from kitchen_viz.wok_passes import Toss, expected_tosses, live_words, tosses_words, why_tosses


def test_a_compare_order_follows_what_its_lesson_order_was_served():
    n, lesson = next((i, x) for i, x in enumerate(LESSONS, start=1) if x.order["prompt"] == "longest")
    assert compare_lesson(str(100 + n)) == (n, lesson) and compare_lesson(str(n)) is None
    assert compare_lesson("nan") is None and compare_lesson(None) is None
    served = {"prompt": 2552, "batch": 3, "new": 8, "temp": 0.0}
    compare, moved = compare_like(lesson, served)
    assert compare == {**lesson.compare_with, "batch": 3} and moved == ["3 tables"]
    assert compare["prompt"] == lesson.compare_with["prompt"]  # what the lesson compares stays as written
    assert compare_like(lesson, {**served, "batch": 4}) == (lesson.compare_with, [])


def tosses(n: int, size: int, others: int = 0) -> list[Toss]:
    return [Toss(i * 0.1, i * 0.1 + 0.09, size, size + others, 1 if i == n - 1 else 0) for i in range(n)]


def test_the_wok_says_why_it_took_several_tosses():
    assert expected_tosses(8192, 512) == 16 and expected_tosses(100, 512) == 1
    assert why_tosses(tosses(1, 800), 4096, 800) == ""
    assert why_tosses(tosses(16, 512), 512, 8192) == (
        "the wok holds 512 tokens a toss and this order's prompts are 8,192 tokens: 16 tosses")
    shared = why_tosses(tosses(3, 100, others=20), 4096, 300)
    assert shared.startswith("3 tosses although the wok holds 4,096 tokens") and "60 tokens" in shared
    assert live_words(tosses(5, 512), 512, 8192, 4) == (
        "toss 6 of about 16 · 1 of 4 tables have their first bowl · the wok holds 512 tokens a toss")
    assert tosses_words(tosses(16, 512)).startswith("16 tosses (90.00 ms, 90.00 ms, 90.00 ms, 90.00 ms, …)")


def test_leftovers_are_named_by_whose_order_cooked_them():
    cooked = [{"number": 1, "label": "prompt 256 tokens × 4 tables", "tables": [10, 11, 12, 13], "kitchen": "chef"},
              {"number": 2, "label": "prompt 32 tokens × 1 table", "tables": [20], "kitchen": "other"}]
    assert source_words([], cooked, "chef") == ""
    assert source_words([10, 12], cooked, "chef") == "from your order #1 (prompt 256 tokens × 4 tables)"
    assert source_words([99], cooked, "chef") == "from another client's order (not one of yours)"
    assert source_words([20], cooked, "chef") == "from another client's order (not one of yours)"  # another kitchen's ids
    assert source_words([10, 99], cooked, "chef").endswith("4 tables) and another client's order (not one of yours)")
