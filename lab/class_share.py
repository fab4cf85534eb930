"""The class as a cause: how many of an order's decode steps also cooked other orders.

In a shared kitchen (the class kitchen, with students' API streams running) every decode step of
a Kitchen order is one pass of the whole batch: its time is the pass's, so a 64 x 2 x 256 order
that measured a TPOT of 1.2 ms alone can measure 10.7 ms while ten streams share its steps. Advice
about the learner's own order ("trim the portioning", "fewer sequences per step") would then be
advice about the class's order. The verdict names the class first, with the share, and only then
says what the steps' shape suggests.

Worked example: 256 decode steps, 222 of them with other orders' sequences in the pass ->
"222 of 256 steps also cooked other orders: the class, not your order, set this TPOT".
Below half the steps the class is named as part of the cause ("part of this TPOT is the class's").
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.trace import StepRecord

MOSTLY = 0.5  # from this share of shared steps on, the class (not the order) set the TPOT


@dataclass(frozen=True)
class ClassShare:
    shared: int  # decode steps whose pass also held other orders' sequences
    steps: int  # the order's decode steps
    others: int  # the most other sequences one of those passes held

    @property
    def share(self) -> float:
        return self.shared / self.steps if self.steps else 0.0

    @property
    def mostly(self) -> bool:
        return self.shared > 0 and self.share >= MOSTLY

    def words(self) -> str:
        """"222 of 256 steps also cooked other orders: the class, not your order, set this TPOT"; "" when none did."""
        if not self.shared:
            return ""
        who = "the class, not your order, set this TPOT" if self.mostly else "part of this TPOT is the class's"
        return f"{self.shared:,} of {self.steps:,} steps also cooked other orders (up to {self.others:,} of their " \
               f"sequences in a step): {who}"  # fmt: skip

    def advice(self) -> str:
        """The first thing to try when the class shared the steps (before any advice about the order itself)."""
        return ("Cook the same order again when the class's streams are quiet (or compare it with one cooked "
                "alone): only then is its TPOT your order's own; the advice below is about the shared steps.")


def class_share(steps: list[StepRecord]) -> ClassShare:
    """The order's decode steps that other orders shared (`StepRecord.others`, set by the shared kitchen)."""
    shared = [s for s in steps if s.others > 0]
    return ClassShare(len(shared), len(steps), max((s.others for s in shared), default=0))
