"""How the Kitchen writes a time and a rate: one format, so one number reads the same everywhere.

The panels, the drawing (its Python-side strings), the timeline bar, the comparison and the
diagnosis all print through these two functions; the drawing's script follows the same rule for
the times it animates (kitchen_viz/art/scene.js `fmtTime`).

    fmt_s(0.03081) -> "30.81 ms"    fmt_s(0.2503) -> "250.3 ms"    fmt_s(1.95) -> "1.95 s"
    fmt_tps(103.4) -> "103 tok/s"   fmt_tps(None) -> "—"
"""

from __future__ import annotations


def fmt_s(seconds: float | None) -> str:
    """Milliseconds below a second (two decimals below 100 ms), seconds above; a dash when not measured."""
    if seconds is None:
        return "—"
    if seconds < 0.1:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def fmt_tps(tps: float | None) -> str:
    return "—" if not tps else f"{tps:,.0f} tok/s"


def reused_words(reused: int, prompt_tokens: int) -> str:
    """The one sentence every view uses when an order started from leftovers ("" when none were reused).

    Example: reused_words(4200, 7168) -> "4,200 of 7,168 prompt tokens reused from leftovers (not cooked)"."""
    if reused <= 0:
        return ""
    return f"{reused:,} of {prompt_tokens:,} prompt tokens reused from leftovers (not cooked)"
