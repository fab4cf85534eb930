"""Suggested orders: a short lesson plan, one order per lesson, each with what to look at.

Why here and not in the page: the same plan is drawn on the Suggested orders page and downloaded
as a printable Markdown file, and a test checks that every order is one the Kitchen accepts. The
plan names no measured number: each lesson says what to compare, and the Kitchen measures it on
the class's own machine. Each order fits the smallest context the app ships (the chef's); a long
prompt is asked as `longest`, which the Kitchen turns into the longest prompt the model's context
and the kitchen's memory allow, so the big banquet grows with a longer-context model.

The first two lessons show both pots winning: a short prompt with many new tokens (the pot), then
the longest prompt with few new tokens (the wok); each says which control moves the bottleneck back.

Each lesson names the model it is for (lab/model_for.py), and its link selects it (`?model=`): the
lessons about the pot being memory-bound ("Two pots", "More tables") run on the assistant, whose
weights do not fit in the CPU's cache, so its pot is the story's; the instant ones on the chef.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from lab.model_for import ASSISTANT, CHEF, ModelFor

LONGEST = "longest"  # the Kitchen's ?prompt=longest: the longest prompt the model and kitchen take


@dataclass(frozen=True)
class Lesson:
    title: str
    order: dict  # query parameters of the Kitchen: prompt (a count or "longest"), batch, new, temp, reuse, wok
    look_at: str  # what to watch on screen
    ask: str  # a question for the class, answered by the screen
    compare_with: dict | None = None  # a second order to cook right after, for the side-by-side comparison
    model: ModelFor = CHEF  # the model both orders cook on (their links select it)


LESSONS: tuple[Lesson, ...] = (
    Lesson(
        "Two pots, one order",
        {"prompt": 32, "batch": 1, "new": 64, "temp": 0},
        "The bar under the panels: how much of E2E is the wok's pass, how much the soup pot? In the "
        "drawing, the wok's tok/s against the pot's tok/s. Then drag Max new tokens down to 4 and cook "
        "again: watch the bar's wok part grow.",
        "Why is the wok so much faster per token than the pot, on the same weights?",
        model=ASSISTANT,
    ),
    Lesson(
        "A big banquet (long prompt)",
        {"prompt": LONGEST, "batch": 4, "new": 8, "temp": 0},
        "TTFT and the wok's timer against TPOT, and the diagnosis: which pot does it name now? Then drag "
        "Max new tokens up to 128 and cook again: the pot takes over. Then cook the same order with a "
        "32-token prompt and open Compare two orders: which of the two numbers did the long prompt change most? "
        "Last, drag Wok size (tokens a toss) down to 512 and cook the banquet again: the drawing and the panels "
        "count the wok's tosses and say why, and the first tables ladle while the last are still in the wok.",
        "Which number would a user notice first: the wait for the first word or the rhythm after it?",
        compare_with={"prompt": 32, "batch": 4, "new": 8, "temp": 0},
    ),
    Lesson(
        "More tables, same ladle",
        {"prompt": 32, "batch": 32, "new": 32, "temp": 0},
        "TPOT (one step) against tokens/s (all tables). Then cook the same order for one table and compare: "
        "how much slower did each step get with 32 tables, and how many more bowls a second did the "
        "kitchen serve?",
        "Why does one ladle for 32 tables not cost 32 times one ladle for one?",
        compare_with={"prompt": 32, "batch": 1, "new": 32, "temp": 0},
        model=ASSISTANT,
    ),
    Lesson(
        "The serving counter fills up",
        {"prompt": 256, "batch": 8, "new": 64, "temp": 0},
        "The KV cache on the counter: handed over from the wok (prompt × tables), then one more token per "
        "table at every step. Replay it and watch the MB and tokens grow.",
        "What would happen to the counter with 64 tables of the longest prompt?",
    ),
    Lesson(
        "One bowl only",
        {"prompt": 64, "batch": 1, "new": 1, "temp": 0},
        "No decode step at all: the only token comes from the wok's logits, TPOT is '—', TTFT is E2E, and "
        "the soup pot stays cold.",
        "So where does the first token of every answer come from?",
    ),
    Lesson(
        "Greedy or creative: same kitchen",
        {"prompt": 64, "batch": 4, "new": 64, "temp": 1.0},
        "Other words than greedy cooking (temperature 0) gives. Then cook the same order at temperature 0 "
        "and compare TPOT: how much of each step is sampling?",
        "Does a 'creative' answer cost the kitchen more time?",
        compare_with={"prompt": 64, "batch": 4, "new": 64, "temp": 0},
    ),
    Lesson(
        "Leftovers (prefix reuse)",
        {"prompt": 256, "batch": 4, "new": 16, "temp": 0, "reuse": 1},
        "Cook this order twice with Reuse leftovers on. The second time the wok panel and the drawing say "
        "how many prompt tokens were reused instead of cooked: compare TTFT. Then turn Reuse leftovers off "
        "and cook it a third time.",
        "Why can a kitchen skip cooking a prompt it has seen, but never the reply?",
    ),
)


COMPARE_MARK = 100  # a compare link's ?lesson= is 100 + the lesson's number (pages/lessons.py)
MATCHED = ("batch", "new", "temp")  # what a compare order shares with its lesson's order, when they ask the same


def compare_lesson(marker: str | None) -> tuple[int, Lesson] | None:
    """The lesson whose "compare with" order a `?lesson=` marker opens (None for a lesson's own order)."""
    try:
        n = int(marker or "") - COMPARE_MARK
    except ValueError:
        return None
    return (n, LESSONS[n - 1]) if 1 <= n <= len(LESSONS) and LESSONS[n - 1].compare_with else None


def compare_like(lesson: Lesson, served: dict) -> tuple[dict, list[str]]:
    """The compare order changed the same way the kitchen changed the lesson's order, and the words for it.

    A value both orders ask for alike (lesson 2's 4 tables) follows what the lesson's order was served
    (3 tables under an 8,192-token cap), so the two differ only where the lesson means them to (the
    prompt). Example: ({"prompt": 32, "batch": 3, "new": 8, "temp": 0}, ["3 tables"])."""
    compare, moved = dict(lesson.compare_with or {}), []
    for key in MATCHED:
        asked = lesson.order.get(key)
        if key in compare and compare[key] == asked and key in served and served[key] != asked:
            compare[key] = served[key]
            moved.append({"batch": f"{served[key]} table{'s' if served[key] != 1 else ''}",
                          "new": f"{served[key]:,} new tokens", "temp": f"temperature {served[key]:g}"}[key])  # fmt: skip
    return compare, moved


def order_words(order: dict) -> str:
    """{"prompt": 32, "batch": 1, "new": 64, "temp": 0} -> "prompt 32 tokens · 1 table · 64 new tokens · temperature 0"."""
    tables = f"{order['batch']} table{'s' if order['batch'] != 1 else ''}"
    prompt = "the longest prompt the model takes" if order["prompt"] == LONGEST else f"prompt {order['prompt']} tokens"
    reuse = " · reuse leftovers on" if order.get("reuse") else ""
    return f"{prompt} · {tables} · {order['new']} new tokens · temperature {order['temp']:g}{reuse}"


def query(order: dict, lesson: int, model: ModelFor | None = None) -> dict:
    """The Kitchen's query parameters for an order; `lesson` makes the Kitchen apply it even in a
    session that already applied a link (see order_form.apply_query_params), and `model` selects the
    model it cooks on (kitchen_viz/model_pick.py)."""
    chosen = {"model": model.name} if model is not None else {}
    return {**{k: str(v) for k, v in order.items()}, **chosen, "lesson": str(lesson)}


def model_words(lesson: Lesson) -> str:
    """"On the assistant: its weights are far bigger than ..." -- the lesson's model and why, one line."""
    return f"On {lesson.model.label}: {lesson.model.why}."


def plan_markdown(base_url: str = "") -> str:
    """The whole plan as Markdown, for printing or handing out (links relative to `base_url`)."""
    lines = [
        "# Two-Pot Kitchen: suggested orders",
        "",
        "Each order shows one lesson. Cook it, then look where the lesson says; every number comes "
        "from this machine.",
        "",
    ]
    for i, lesson in enumerate(LESSONS, start=1):
        lines += [
            f"## {i}. {lesson.title}",
            "",
            f"- **Order:** {order_words(lesson.order)} ({base_url}/?{urlencode(query(lesson.order, i, lesson.model))})",
            f"- **Model:** {model_words(lesson)}",
        ]
        if lesson.compare_with:
            lines.append(f"- **Then cook, to compare:** {order_words(lesson.compare_with)}")
        lines += [f"- **Look at:** {lesson.look_at}", f"- **Ask:** {lesson.ask}", ""]
    return "\n".join(lines)
