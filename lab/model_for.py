"""Which model each lesson and each lab experiment is for, and why, in one line.

Why it matters: the story's soup pot is memory-bound: every ladle reads every weight from the
pantry (DRAM). That is only what the screen measures when the weights do not fit in the CPU's
cache. The chef (about 20 MB in float32) fits in a 32 MB L3, so its pot reads from cache and is
not the story's pot; the assistant (SmolLM2-135M-Instruct, about 538 MB) does not fit in any
cache, so its pot really streams its weights from memory at every step. Lessons about the pot
being memory-bound therefore run on the assistant; the instant ones stay on the chef (trained
here, always at hand, a few milliseconds a token).

Who reads it: `lab.experiment.Experiment.model` (every lab page defaults to its experiment's model,
kitchen_viz/model_pick.py) and `kitchen_viz.lessons.Lesson.model` (each lesson's order carries it
as `?model=`). The names are catalog names (serving/catalog.toml).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFor:
    name: str  # the catalog name the page or order selects
    label: str  # how the page names it: "the assistant"
    why: str  # one line: why a lesson of this kind runs on it


ASSISTANT = ModelFor(
    "assistant",
    "the assistant",
    "its weights are far bigger than the CPU's cache, so the soup pot reads all of them from memory at every "
    "step, as in the story",
)
CHEF = ModelFor(
    "chef",
    "the chef",
    "it is instant: small, trained here and always at hand",
)
