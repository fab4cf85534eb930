"""Which roof explains a measured pass: the rule that puts every roofline point under its ceiling.

Kitchen words: a pot is only as fast as the shelf its ingredients come from. The pantry (DRAM) is
far; a shelf by the stove (the L3 cache) is near. A small recipe whose whole pantry fits on the
shelf is fetched from the shelf every time, so it beats the speed of the pantry door: that is not
cheating, it is a nearer shelf.

Engine words: a pass reads `bytes_moved` (weights, KV cache, activations). If they fit in a cache
level, they stay there between steps and the pass's ceiling is that level's measured bandwidth,
not DRAM's. So each point is placed under its *home* roof (`Roofline.home`: the smallest level its
bytes fit in) and its share of the roof is taken against that roof. Worked example on this machine
kind: the chef's decode step reads 19 MB, which fit in the 32 MB L3, so it sits under the L3 roof
(and may well be above the DRAM roof); the assistant's reads 538 MB: DRAM.

Two cases are never left silent, each named in one line on the page:
  * above its home roof by more than the roofs' noise (NOISE_MARGIN): part of the bytes stayed in a
    faster level, or the home roof was measured in a slower moment; the point is placed under the
    next faster roof that covers it, and the line says which.
  * above every roof: no measured ceiling explains it, so it is a measurement artefact (the roofs
    measured in a slower moment than the pass ran in, on shared cores); drawn as measured, marked,
    and named. Within the noise margin the line says so; past it, it says to re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.bench.roofline import MemoryRoof, Roofline

NOISE_MARGIN = 0.10  # a roof measured on shared cores is trusted to within 10 %


@dataclass(frozen=True)
class Placement:
    roof: str  # the roof that explains the point: "L2", "L3", "DRAM"
    home: str  # the roof its bytes fit under
    attainable_flops_per_s: float  # that roof's height at the point's intensity
    pct_of_roof: float  # achieved / attainable, in %
    above_every_roof: bool
    line: str = ""  # one line when the point is not simply under its home roof; else ""


def mb(nbytes: float) -> str:
    """A model's or a pass's bytes, in decimal MB as the rest of the app writes them: '538 MB'."""
    return f"{nbytes / 1e6:,.0f} MB" if nbytes >= 1e6 else f"{nbytes / 1e6:.2f} MB"


def cache_mb(nbytes: float) -> str:
    """A cache's size as the machine reports it, in binary MB: 33554432 -> '32 MB'."""
    return f"{nbytes / 2**20:,.3g} MB"


def level_words(m: MemoryRoof) -> str:
    """'the 32 MB L3' / 'DRAM'."""
    return m.name if m.capacity_bytes is None else f"the {cache_mb(m.capacity_bytes)} {m.name}"


def place_point(roof: Roofline, label: str, intensity: float, bytes_moved: float, achieved: float) -> Placement:
    """The roof that explains a pass reading `bytes_moved` at `intensity` that reached `achieved` FLOP/s."""
    home = roof.home(bytes_moved)
    levels = roof.memory_roofs()
    home_top = roof.attainable(intensity, home)
    tops = {m.name: roof.attainable(intensity, m) for m in levels}
    highest = max(levels, key=lambda m: tops[m.name])
    if achieved > tops[highest.name]:
        top = tops[highest.name]
        pct = 100 * achieved / top if top > 0 else 0.0
        compute = top >= roof.flops_per_s  # every roof is flat here: the compute roof is the one it beat
        beaten = (f"the compute roof ({roof.flops_per_s / 1e9:.1f} GFLOP/s, measured on a square matrix multiply)"
                  if compute else f"the {highest.name} roof, the highest here")  # fmt: skip
        why = (f"within the roofs' measurement noise ({NOISE_MARGIN:.0%})" if pct <= 100 * (1 + NOISE_MARGIN) else
               "a measurement artefact: the roofs were measured in a slower moment of these shared cores "
               "than this pass ran in; re-run to measure them again")  # fmt: skip
        line = f"{label} is drawn above every roof ({pct:.0f}% of {beaten}): {why}"
        return Placement(home.name if compute else highest.name, home.name, top, pct, True, line)
    if home_top > 0 and achieved > home_top * (1 + NOISE_MARGIN):
        faster = [m for m in levels if tops[m.name] >= achieved and m.bandwidth_bytes_per_s > home.bandwidth_bytes_per_s]
        under = min(faster, key=lambda m: m.bandwidth_bytes_per_s)
        line = (f"{label} ran at {100 * achieved / home_top:.0f}% of the {home.name} roof its {mb(bytes_moved)} "
                f"come through, so it is drawn under the {under.name} roof: part of them stayed in "
                f"{level_words(under)} between steps, or the {home.name} roof was measured in a slower moment")  # fmt: skip
        return Placement(under.name, home.name, tops[under.name], 100 * achieved / tops[under.name], False, line)
    pct = 100 * achieved / home_top if home_top > 0 else 0.0
    return Placement(home.name, home.name, home_top, pct, False)


def cache_line(roof: Roofline, model: str, weight_bytes: float, step_bytes: float, achieved: float,
               intensity: float) -> str:  # fmt: skip
    """One line on where a model's decode step reads its weights from, and what that does to its point.

    "the chef's 20 MB of weights fit in the 32 MB L3: its pot reads them from cache, so it sits above
    the DRAM roof" / "the assistant's 538 MB of weights do not fit in the 32 MB L3: its pot reads them
    from DRAM at every step, so it sits under the DRAM roof". Empty when no cache roof was measured."""
    if not roof.caches:
        return ""
    home = roof.home(step_bytes)
    if home.capacity_bytes is None:
        largest = max(roof.caches, key=lambda m: m.capacity_bytes or 0)
        return (f"the {model}'s {mb(weight_bytes)} of weights do not fit in {level_words(largest)}: its pot "
                f"reads them from DRAM at every step, so it sits under the DRAM roof")  # fmt: skip
    above = achieved > roof.attainable(intensity)
    where = "so it sits above the DRAM roof" if above else f"so its ceiling is the {home.name} roof, not the DRAM roof"
    return (f"the {model}'s {mb(weight_bytes)} of weights fit in {level_words(home)}: its pot reads them "
            f"from cache, {where}")  # fmt: skip


def roof_notes(points: list, roof: Roofline, model: str, weight_bytes: float) -> list[str]:
    """The page's lines: where the pot reads its weights from, any point not simply under its roof,
    the roofs measured, and each point's share of its roof."""
    decode = sorted((p for p in points if p.phase == "decode"), key=lambda p: p.intensity)
    notes = []
    if decode:
        first = decode[0]
        line = cache_line(roof, model, weight_bytes, first.bytes_moved, first.achieved_flops_per_s, first.intensity)
        notes += [line] if line else []
    notes += [p.line for p in points if p.line]
    roofs = ", ".join(
        f"{m.name} {m.bandwidth_bytes_per_s / 1e9:.1f} GB/s" + (f" ({cache_mb(m.capacity_bytes)})" if m.capacity_bytes else "")
        for m in roof.memory_roofs()
    )
    notes.append(f"roofs measured in this run: {roofs}; compute {roof.flops_per_s / 1e9:.1f} GFLOP/s")
    notes += list(roof.cache_notes)
    notes.append(
        f"ridge at {roof.ridge:.1f} FLOP/byte (DRAM): left of it a pass is memory-bound, right of it compute-bound"
    )
    notes += [
        f"{p.phase} {p.label}: {p.intensity:.2f} FLOP/byte, {p.achieved_flops_per_s / 1e9:.2f} GFLOP/s = "
        f"{p.pct_of_roof:.0f}% of the {p.roof} roof there"
        for p in points
    ]
    return notes
