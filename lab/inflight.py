"""One measurement per experiment at a time: the second visitor follows the first one's run.

Why: a teacher says "everyone press Run" and thirty browsers ask the one kitchen for the same
sweep. Queued one after another that is thirty identical minutes of measurement. Instead, a run is
registered under its cache key while it cooks; a visitor asking for the same key joins it and
watches the same progress bar, and everyone gets the same stored result when it ends.

Thread-safe (Streamlit runs each browser session's script in its own thread); pure Python, no
Streamlit, so it is unit-tested directly. The page keeps one `InFlight` per server process.

Example:
    job, joined = inflight.join_or_submit(key, lambda: service.submit(work, "lab: banquet"))
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class InFlight:
    def __init__(self) -> None:
        self._jobs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def join_or_submit(self, key: str, submit: Callable[[], Any]) -> tuple[Any, bool]:
        """The unfinished job already measuring `key` (joined=True), else a new one from `submit()`."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None and not job.finished:
                return job, True
            job = submit()
            self._jobs[key] = job
            return job, False

    def running(self, key: str) -> Any | None:
        with self._lock:
            job = self._jobs.get(key)
            return job if job is not None and not job.finished else None
