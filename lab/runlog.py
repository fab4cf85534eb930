"""The server's run log: one row per finished order, for the monitoring dashboard.

Why a separate log: the kitchen page shows one order at a time, but a service is judged over many.
Every Cook the app finishes is recorded here (by the worker thread, while browser sessions read it),
so the dashboard can draw TTFT and TPS percentiles over time, queue wait, KV memory and load.

Thread-safety: `record` and `frame` take one lock; rows are plain dicts copied out under it, so a
reader never sees a half-written row.

Example:
    log = RunLog()
    log.record(model="chef", device="cpu", result=engine.generate(["ROMEO:"]), queue_wait_s=0.02)
    log.frame()[["ttft_s", "tpot_s", "decode_tps"]]
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from statistics import median
from typing import TYPE_CHECKING

import pandas as pd

from lab.class_share import class_share

if TYPE_CHECKING:  # only for the type hint; the log never needs the engine itself
    from engine.engine import GenerationResult

# Column order of `frame()`, fixed so an empty log still has the dashboard's columns.
COLUMNS = [
    "wall_time",  # when the run was recorded (UTC)
    "model",
    "device",
    "dtype",  # the precision of weights and KV cache
    "batch",  # sequences in the request
    "prompt_tokens",  # real prompt tokens, summed over the batch
    "reused_tokens",  # of those, taken from a cached prefix instead of computed (prefill_tps excludes them)
    "output_tokens",  # generated tokens, summed over the batch
    "queue_wait_s",  # time the order waited for the kitchen before cooking started
    "ttft_s",
    "tpot_s",
    "itl_median_s",
    "e2e_s",
    "latency_s",  # what the user waited in all: queue wait + E2E
    "prefill_s",
    "prefill_tps",
    "decode_tps",
    "kv_cache_mb",  # peak live KV cache, MB (10^6 bytes)
    "kv_allocated_mb",
    "decode_steps",  # the order's decode steps
    "shared_steps",  # of those, steps whose pass also cooked other orders (the class's time is in them)
    "cause",  # who set the TPOT: "the class: N of M steps also cooked other orders", or "this order"
]


def row_from_result(*, model: str, device: str, result: GenerationResult, queue_wait_s: float) -> dict:
    """One log row from a finished generation: its metrics plus who ran it and how long it queued."""
    m = result.metrics
    return {
        "wall_time": datetime.now(timezone.utc),
        "model": model,
        "device": device,
        "dtype": getattr(result, "dtype", "") or "",
        "batch": len(result.tokens),  # the order's tables (a class kitchen's pass may hold others' too)
        "prompt_tokens": sum(result.prompt_tokens),
        "reused_tokens": getattr(result, "reused_tokens", 0),
        "output_tokens": m.output_tokens,
        "queue_wait_s": float(queue_wait_s),
        "ttft_s": m.ttft_s,
        "tpot_s": _measured(m.tpot_s),
        "itl_median_s": median(m.itl_s) if m.itl_s else float("nan"),
        "e2e_s": m.e2e_s,
        "latency_s": float(queue_wait_s) + m.e2e_s,
        "prefill_s": m.prefill_s,
        "prefill_tps": _measured(m.prefill_tps),
        "decode_tps": _measured(m.decode_tps),
        "kv_cache_mb": m.kv_cache_bytes / 1e6,
        "kv_allocated_mb": m.kv_cache_allocated_bytes / 1e6,
        **cause_columns(result),
    }


def cause_columns(result) -> dict:
    """The order's decode steps, those the class shared, and who set its TPOT, in the inspector's words."""
    trace = getattr(result, "trace", None)
    shared = class_share(trace.decode_steps if trace is not None else [])
    cause = "this order" if not shared.shared else \
        f"{'the class' if shared.mostly else 'partly the class'}: {shared.shared} of {shared.steps} steps also cooked other orders"  # fmt: skip
    return {"decode_steps": shared.steps, "shared_steps": shared.shared, "cause": cause}


def _measured(value: float | None) -> float:
    """A frame column holds floats: a figure that was not measured is NaN there (pandas skips it)."""
    return float("nan") if value is None else float(value)


def tpot_by_dtype(frame: pd.DataFrame, model: str, device: str, batch: int) -> dict[str, float]:
    """Median TPOT per dtype of this model, device and batch (orders with a decode step only):
    what the inspector may say about a smaller dtype on this machine. Example -> {"float32": 0.0026,
    "bfloat16": 0.0045}."""
    rows = frame[(frame["model"] == model) & (frame["device"] == device) & (frame["batch"] == batch)]
    rows = rows[rows["tpot_s"] > 0]
    return {str(d): float(g["tpot_s"].median()) for d, g in rows.groupby("dtype") if d}


class RunLog:
    """Append-only, thread-safe list of finished runs for one server process."""

    def __init__(self) -> None:
        self._rows: list[dict] = []
        self._lock = threading.Lock()

    def record(self, *, model: str, device: str, result: GenerationResult, queue_wait_s: float) -> None:
        row = row_from_result(model=model, device=device, result=result, queue_wait_s=queue_wait_s)
        with self._lock:
            self._rows.append(row)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def frame(self) -> pd.DataFrame:
        """All runs so far, oldest first, with the columns in `COLUMNS` (also when empty)."""
        with self._lock:
            rows = [dict(r) for r in self._rows]
        df = pd.DataFrame(rows, columns=COLUMNS)
        df["wall_time"] = pd.to_datetime(df["wall_time"], utc=True)
        return df
