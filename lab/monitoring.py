"""The dashboard's arithmetic: latency percentiles over time and requests per minute.

Why separate TTFT and TPS panels (the seed's advice): they answer different questions and have
different fixes. A TTFT p99 that climbs says the wok is struggling (long prompts, big batches,
queueing); a falling TPS says the soup pot is. Averaging them into one "latency" hides both.

Percentiles are over a trailing time window (default 5 minutes) ending at each run, so the lines
show how the service is doing *now*, not since the server started. With few runs a window holds
only a handful of values; p99 of 5 values is simply the largest, and the page says how many runs
each window held.

Example:
    stats = with_percentiles(run_log.frame(), ["ttft_s", "decode_tps"], window="5min")
    stats[["wall_time", "ttft_s_p50", "ttft_s_p99", "window_runs"]]
"""

from __future__ import annotations

import pandas as pd

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
# What each line means, for a legend: p90 and p99 are always the slow tail.
SLOW_TAIL = {"p50": "median", "p90": "slowest 10 %", "p99": "slowest 1 %"}


def is_rate(column: str) -> bool:
    """A rate (tokens/s): bigger is faster, so its slow tail is its low end."""
    return column.endswith(("_tps", "_per_s"))


def slow_tail_level(column: str, q: str) -> float:
    """The quantile that `q` means for this column: p99 of a time is its 0.99 quantile (the slowest
    1 %), p99 of a rate its 0.01 quantile (also the slowest 1 %). Example: ("decode_tps", "p90") -> 0.1."""
    level = QUANTILES[q]
    return 1 - level if is_rate(column) else level


def with_percentiles(frame: pd.DataFrame, columns: list[str], window: str = "5min") -> pd.DataFrame:
    """Add `<col>_p50/_p90/_p99` (trailing window ending at each run) and `window_runs`; p90 and p99
    are the slow tail of every column (`slow_tail_level`: for a rate, its low end)."""
    out = frame.sort_values("wall_time").reset_index(drop=True).copy()
    if out.empty:
        for col in columns:
            for q in QUANTILES:
                out[f"{col}_{q}"] = pd.Series(dtype=float)
        out["window_runs"] = pd.Series(dtype=int)
        return out
    indexed = out.set_index("wall_time")
    for col in columns:
        rolling = indexed[col].astype(float).rolling(window)
        for q in QUANTILES:
            out[f"{col}_{q}"] = rolling.quantile(slow_tail_level(col, q), interpolation="linear").to_numpy()
    out["window_runs"] = indexed[columns[0]].rolling(window).count().astype(int).to_numpy()
    return out


def requests_per_minute(frame: pd.DataFrame) -> pd.Series:
    """Finished runs per wall-clock minute (minutes with no runs show 0)."""
    if frame.empty:
        return pd.Series(dtype=int, name="requests")
    counts = frame.set_index("wall_time").resample("1min")["model"].count()
    return counts.rename("requests")


def summary(frame: pd.DataFrame) -> dict[str, float]:
    """Whole-session headline numbers for the dashboard's metric row."""
    if frame.empty:
        return {"runs": 0}
    return {
        "runs": len(frame),
        "ttft_p50_ms": frame.ttft_s.quantile(0.5) * 1e3,
        "ttft_p99_ms": frame.ttft_s.quantile(0.99) * 1e3,
        "tpot_p50_ms": frame.tpot_s.quantile(0.5) * 1e3,
        "decode_tps_p50": frame.decode_tps.quantile(0.5),
        "e2e_p50_ms": frame.e2e_s.quantile(0.5) * 1e3,
        "queue_wait_p90_ms": frame.queue_wait_s.quantile(0.9) * 1e3,
        "kv_mb_max": frame.kv_cache_mb.max(),
    }
