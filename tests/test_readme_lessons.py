"""The README describes the lesson plan the app has: its count and every lesson's title come from
kitchen_viz/lessons.py, the one plan the Suggested orders page draws."""

from __future__ import annotations

import re
from pathlib import Path

from kitchen_viz.lessons import LESSONS

REPO = Path(__file__).resolve().parent.parent
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def test_the_readme_names_as_many_lessons_as_the_page_draws_and_each_by_its_title():
    readme = " ".join((REPO / "README.md").read_text().split())
    counts = re.findall(r"\b(\w+)-order lesson plan", readme)
    assert counts == [WORDS[len(LESSONS)]], (counts, len(LESSONS))
    missing = [lesson.title for lesson in LESSONS if lesson.title not in readme]
    assert not missing, missing
