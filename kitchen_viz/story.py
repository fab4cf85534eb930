"""The two-pot story, in our own words, and the map from each kitchen element to the engineering.

Kept as data (not prose inside the page) so the page stays a thin renderer and a test can check
that every element links to a page that exists. Each `Mapping.link` is a page file (the kitchen,
where the control lives) or a lab page's address (`lab_padding`), whose element and meaning
live in the experiment itself (`Experiment.story`, listed by `lab.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kitchen_viz.icons import without_emoji
from lab.registry import EXPERIMENTS

KITCHEN = "pages/kitchen.py"

STORY = [
    (
        "One stove, two pots",
        "A banquet hall's kitchen is run by two cooks who share one stove. The first works a **wok** over a "
        "roaring flame: every ingredient for a table goes in together, gets tossed for a moment, and comes out "
        "at once. He cannot start until the whole order is prepped. The second minds a **soup pot** on a gentle "
        "flame. The broth is already made; when guests want soup she fills one bowl per ladle, tasting as she "
        "goes, and no amount of shouting makes the ladle hold two bowls at a time.",
    ),
    (
        "The busy night",
        "One season brought a run of huge banquets. The wok's orders grew from a plate to a platter; the fire "
        "was the same, but each toss took far longer. The soup pot's pace per bowl never changed, yet the "
        "guests' evenings grew long. When the manager read the complaints, most were not about the food arriving "
        "late: they were about the long, awkward wait for soup after the stir-fry had already landed.",
    ),
    (
        "Two fixes for two pots",
        "The head cook made two changes. At the wok, every order had to be fully prepped before the flame was "
        "lit, so the hot pan never sat waiting for a missing onion. At the soup pot, a warm **portioning "
        "station** set bowls out in advance, so each ladle only needed its last touch. The slow end of the "
        "kitchen got faster, and the complaints stopped.",
    ),
    (
        "Why not one pot?",
        "An apprentice asked why they didn't just cook everything in one pot. The answer: the wok wants a short "
        "blast of heat, the soup pot a long low simmer; one stove setting would spoil both. What helps is the "
        "**serving counter** between them: the wok slides its hot dish straight onto it and the soup side picks "
        "up from there, nothing cooled and reheated. The two stations stay separate; the hand-off stays warm.",
    ),
    (
        "Serving the whole hall",
        "Success brought a new problem: not one banquet but a full hall, tickets arriving all evening. During the "
        "**dinner rush** the cooks first served in rounds, and a table that wanted one bowl waited for a "
        "neighbour's tureen; letting each new ticket take the first free place at the pot ended that. Then a "
        "**banquet ticket landed while the soup was being served**, and tossing it all at once left every table "
        "staring at a still ladle; tossing it a handful at a time between ladles kept the rhythm. And since "
        "most orders began with the same base, the **house stock was kept on the counter** instead of being "
        "boiled again for each table, until the counter ran out of room.",
    ),
]


@dataclass(frozen=True)
class Mapping:
    kitchen: str  # the element in the scene
    engineering: str  # what it is in LLM inference
    link: str  # page that shows it
    link_label: str


KITCHEN_MAPPINGS = [
    Mapping(
        ":material/local_fire_department: The wok, tossing everything at once",
        "**Prefill**: one forward pass over every prompt token of every request in the batch. Lots of "
        "arithmetic per byte of weights read, so it is *compute-bound*. The **first token** of every "
        "table is sampled from this pass's logits (the soup pot has not ladled yet), so it sets **TTFT**.",
        KITCHEN,
        "Kitchen: press Cook and watch the wok",
    ),
    Mapping(
        ":material/soup_kitchen: The soup pot, one bowl per ladle",
        "**Decode**: one new token per sequence per step. Every step rereads all the weights and the KV cache "
        "for very little arithmetic, so it is *memory-bound*; it sets **TPOT / ITL**.",
        KITCHEN,
        "Kitchen: max new tokens",
    ),
]

# The lab's experiments, each linked from its own element of the story (lab/registry.py's order).
MAPPINGS = KITCHEN_MAPPINGS + [
    Mapping(
        without_emoji(e.story.element),
        e.story.meaning,
        e.url_path,
        without_emoji(e.story.link_label),
    )
    for e in EXPERIMENTS
]
