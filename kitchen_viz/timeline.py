"""From the engine's event stream to the scene's timeline: what happened, when, in engine seconds.

Why a separate, pure module: the page's fragment wakes several times a second and must do almost
nothing (the instrument must not disturb the measurement), so it hands each new event to
`LiveRun.consume`, which folds it into a small summary in O(new events). `scene_data()` is then
the compact, JSON-ready dict the drawn kitchen replays. Nothing here calls Streamlit or torch.

Worked example (events as the engine yields them, times in seconds since the request started):
    PrefillStart(t=0.000, batch=2, prompt_tokens=[5, 3]) -> the wok is lit, 8 tokens go in
    PrefillEnd(t=0.012, kv_bytes=65536)                  -> 64 KB of KV cache slides to the counter
    Token(t=0.013, seq=0, step=0, text=" the")           -> first bowl for table 1 (TTFT = 0.013 s)
    StepEnd(t=0.016, decode step 1)                      -> one ladle per table, 3 ms after the last
A decode step of 3 ms is far faster than the eye, so `choose_slowdown` picks a replay factor
(here 50: one ladle every 150 ms on screen) and the scene says "×50 slower than real".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from statistics import median
from typing import Any

from engine.events import Done, PrefillEnd, PrefillStart, Restart, StepEnd, Token, WokPass
from kitchen_viz.wok_passes import Toss, live_words, why_tosses
from lab.units import fmt_s, fmt_tps, reused_words

# A step the viewer can follow takes at least this long on screen; the wok burns at least this.
MIN_VISIBLE_STEP_S = 0.15
MIN_VISIBLE_PREFILL_S = 0.6
MAX_REPLAY_S = 40.0  # never stretch a replay past this: long runs play faster instead
NICE_FACTORS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SCENE_TABLES = 16  # tables drawn one by one (two rows of 8); every table is measured and counted


def choose_slowdown(prefill_s: float, itl_s: float | None, e2e_s: float) -> int:
    """How many times slower than real the kitchen replays, so both pots are visible.

    One factor for the whole run, so the wok's burn and the pot's ladles keep their true ratio.
    Example: prefill 10 ms, median ITL 3 ms -> need 60x for the wok, 50x for the ladle -> 100x,
    unless that stretches the whole run past MAX_REPLAY_S.
    """
    need = MIN_VISIBLE_PREFILL_S / prefill_s if prefill_s > 0 else 1.0
    if itl_s:
        need = max(need, MIN_VISIBLE_STEP_S / itl_s)
    cap = MAX_REPLAY_S / e2e_s if e2e_s > 0 else need
    want = min(need, cap)
    fitting = [f for f in NICE_FACTORS if f >= want]
    pick = fitting[0] if fitting else NICE_FACTORS[-1]
    if pick > cap:  # rounding up overshot the cap: round down instead
        pick = max([f for f in NICE_FACTORS if f <= cap] or [1])
    return pick


def slowdown_label(factor: int) -> str:
    return "real speed" if factor <= 1 else f"×{factor:,} slower than real"


@dataclass
class LiveRun:
    """What one Cook has measured so far, folded from its events as they arrive."""

    run_id: str
    batch: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    mode: str = "padded"
    slots: int = 0
    t_prefill_start: float | None = None
    t_prefill_end: float | None = None
    kv_handed_bytes: int = 0
    wok_tokens: int = 0  # tokens the wok's pass(es) computed (the trace's prefill record): its rate's numerator
    wok: int = 0  # the wok's size: tokens one pass holds (the kitchen's token budget, or the order's own)
    tosses: list[Toss] = field(default_factory=list)  # the wok's passes, when the prompts took more than one
    decode_steps: list[tuple[float, float, int]] = field(default_factory=list)  # (t_start, t_end, kv_bytes)
    tokens: list[list[tuple[float, str]]] = field(default_factory=list)  # per table: (t, text piece)
    finished: list[bool] = field(default_factory=list)
    served: list[list[float]] = field(default_factory=list)  # [t, bowls so far over all tables]
    t_first_token: float | None = None
    t_done: float | None = None
    result: Any = None  # the GenerationResult from Done
    slowdown: int | None = None  # fixed once chosen, so a replay never changes speed mid-way
    seen: int = 0  # events consumed
    restarts: list[tuple[float, int]] = field(default_factory=list)  # (t, tokens served) where the engine restarted

    @classmethod
    def for_order(cls, run_id: str, prompt_tokens: list[int], wok: int = 0) -> LiveRun:
        """A run that already knows its tables (one per prompt, with its token count) before the
        engine starts, so the scene draws the tickets and tables while the page that pressing
        Cook produced is painted, not in the measured cook. `PrefillStart` then confirms them.

        Example: LiveRun.for_order("a", [25, 25]).scene_data()["shown_tables"] -> 2.
        """
        run = cls(run_id=run_id, batch=len(prompt_tokens), prompt_tokens=list(prompt_tokens), wok=wok)
        run.tokens = [[] for _ in prompt_tokens]
        run.finished = [False] * len(prompt_tokens)
        return run

    def consume(self, events: list) -> int:
        """Fold `events[self.seen:]` in; returns how many were new."""
        new = events[self.seen :]
        for ev in new:
            self._fold(ev)
        self.seen += len(new)
        if self.slowdown is None and (self.t_done is not None or len(self.decode_steps) >= 3):
            self.slowdown = choose_slowdown(self.prefill_s or 0.0, self.median_itl_s, self.e2e_estimate_s)
        return len(new)

    def _fold(self, ev) -> None:
        if isinstance(ev, PrefillStart):
            self.batch, self.prompt_tokens = ev.batch, list(ev.prompt_tokens)
            self.mode, self.slots, self.t_prefill_start = ev.mode, ev.slots, ev.t
            self.tokens = [[] for _ in range(ev.batch)]
            self.finished = [False] * ev.batch
        elif isinstance(ev, WokPass):  # one toss of a wok that takes several, as it ends
            self.tosses.append(Toss.of(ev))
        elif isinstance(ev, PrefillEnd):  # the measured pass itself, as the trace records it
            self.t_prefill_start, self.t_prefill_end = ev.step.t_start, ev.step.t_end
            self.kv_handed_bytes = ev.kv_bytes
            self.wok_tokens = ev.step.tokens
            self.tosses = [Toss.of(p) for p in ev.passes]
            # The order's TTFT: every table has its first bowl once the wok's last pass ends (the
            # engine's metrics say the same), not when the first table got one in an earlier pass.
            self.t_first_token = ev.t
        elif isinstance(ev, Token):
            self.tokens[ev.seq].append((ev.t, ev.text))
            self.finished[ev.seq] = ev.finished
            if self.served and self.served[-1][0] == ev.t:  # one step's tokens share its time
                self.served[-1][1] += 1
            else:
                self.served.append([ev.t, (self.served[-1][1] if self.served else 0) + 1])
            if self.t_first_token is None and self.t_prefill_end is not None:
                self.t_first_token = ev.t
        elif isinstance(ev, Restart):  # a fresh engine process took the order over at t
            self.restarts.append((ev.t, ev.kept))
        elif isinstance(ev, StepEnd) and ev.step.phase == "decode":
            self.decode_steps.append((ev.step.t_start, ev.step.t_end, ev.step.kv_bytes))
        elif isinstance(ev, Done):
            self.t_done, self.result = ev.t, ev.result

    # -- what has been measured so far (provisional until Done, then the engine's own metrics) ----

    @property
    def prefill_s(self) -> float | None:
        if self.t_prefill_start is None or self.t_prefill_end is None:
            return None
        return self.t_prefill_end - self.t_prefill_start

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output tokens, one per decode step (vLLM's ITL)."""
        if self.result is not None:
            return list(self.result.metrics.itl_s)
        if self.t_first_token is None:
            return []
        ends = [self.t_first_token] + [end for _, end, _ in self.decode_steps]
        return [b - a for a, b in pairwise(ends)]

    @property
    def median_itl_s(self) -> float | None:
        itl = self.itl_s
        return median(itl) if itl else None

    @property
    def e2e_estimate_s(self) -> float:
        if self.t_done is not None:
            return self.t_done
        return self.decode_steps[-1][1] if self.decode_steps else (self.t_first_token or 0.0)

    @property
    def reused(self) -> int:
        """Prompt tokens the order took from leftovers instead of cooking: the engine's count once
        done; before, what the wok said it would compute (a packed pass's slots) fell short of the prompts."""
        if self.result is not None:
            return int(getattr(self.result, "reused_tokens", 0) or 0)
        total = sum(self.prompt_tokens)
        return total - self.slots if self.mode == "packed" and 0 < self.slots < total else 0

    @property
    def wok_rate(self) -> float | None:
        """The wok's tokens per second: the tokens its pass computed over the pass's time (never the
        reused ones). The same number as the engine's `metrics.prefill_tps` once the order is done."""
        if self.result is not None:
            return self.result.metrics.prefill_tps or None
        s = self.prefill_s
        return self.wok_tokens / s if s and self.wok_tokens else None

    def summary(self) -> dict | None:
        """The finished order's pot figures as the panels print them (one computation: the engine's
        metrics), for the drawing's last frame; None until done or with no decode step."""
        if self.result is None or not self.result.metrics.itl_s:
            return None
        m = self.result.metrics
        return {"tpot": fmt_s(m.tpot_s), "tps": fmt_tps(m.decode_tps), "steps": len(m.itl_s)}

    @property
    def cooked(self) -> int:
        """Prompt tokens the wok cooks for this order (the reused ones are not cooked)."""
        return max(0, sum(self.prompt_tokens) - self.reused)

    @property
    def wok_why(self) -> str:
        """Why the wok took several tosses ("" for one): the same line in the drawing, the panels and the timeline."""
        return why_tosses(self.tosses, self.wok, self.cooked)

    @property
    def wok_live(self) -> str:
        """While the wok is still on after some tosses: which toss, how many tables have a first bowl."""
        if self.t_prefill_end is not None:
            return ""
        return live_words(self.tosses, self.wok, self.cooked, self.batch)

    @property
    def text(self) -> list[str]:
        return ["".join(piece for _, piece in seq) for seq in self.tokens]

    # -- the scene's data ------------------------------------------------------------------------

    @property
    def e2e_s(self) -> float | None:
        """The engine's E2E once done (its last token), the moment the panels and the drawing share."""
        return self.result.metrics.e2e_s if self.result is not None else None

    def scene_data(self, *, presenter: bool = False, wok_capacity: int = 0) -> dict:
        """The compact dict the drawn kitchen replays (times rounded to 0.01 ms).

        `t_done` is the engine's E2E (the last token) once the order is done, so the drawing's
        "every table served" and the panels' E2E are one number; `served` is [t, bowls so far over
        every table] per step, so a batch larger than the tables drawn is still counted."""
        shown = min(self.batch, SCENE_TABLES)
        e2e = self.e2e_s
        return {
            "run_id": self.run_id,
            "presenter": presenter,
            "batch": self.batch,
            "shown_tables": shown,
            "prompt_tokens": self.prompt_tokens,
            "slots": self.slots,
            "wok_tokens": self.wok_tokens,
            "wok_rate": fmt_tps(self.wok_rate) if self.wok_rate else "",
            "reused": self.reused,
            "reused_words": reused_words(self.reused, sum(self.prompt_tokens)),
            "summary": self.summary(),
            "mode": self.mode,
            "wok_capacity": max(wok_capacity, sum(self.prompt_tokens), 1),
            "prefill": _round_pair(self.t_prefill_start, self.t_prefill_end),
            "kv_handed": self.kv_handed_bytes,
            "steps": [[round(a, 5), round(b, 5), kv] for a, b, kv in self.decode_steps],
            "tokens": [[[round(t, 5), piece] for t, piece in seq] for seq in self.tokens[:shown]],
            "t_first": _round(self.t_first_token),
            "t_done": _round(e2e if e2e is not None else self.t_done),
            "e2e": _round(e2e),
            "served": [[round(t, 5), n] for t, n in self.served],
            "slowdown": self.slowdown,
            "slowdown_label": slowdown_label(self.slowdown) if self.slowdown else "",
            "tosses": [[round(x.t_start, 5), round(x.t_end, 5), x.tokens] for x in self.tosses],
            "wok_why": self.wok_why,
            "wok_live": self.wok_live,
            "restarts": [[round(t, 5), kept] for t, kept in self.restarts],
        }


def _round(t: float | None) -> float | None:
    return None if t is None else round(t, 5)


def _round_pair(a: float | None, b: float | None) -> list | None:
    return None if a is None else [round(a, 5), _round(b)]
