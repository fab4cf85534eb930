"""`EngineProxy`: what pages, the kitchen's worker and the lab hold instead of an `Engine`.

Same names as the engine (docs/engine-api.md): `info`, `cfg`, `limits`, `check`, `encode`,
`decode`, `generate`, `stream`, plus `run(fn, *args, **kwargs)` for code that must touch the real
engine (model internals, torch.profiler, process CPU time). Each call is answered by the engine's
child process (serving/engine_process.py):

    eng = EngineProcess("chef", "cpu", "float32", threads=1).proxy
    eng.info.name, eng.cfg.n_layers                    # copied once, at load: no round trip
    res = eng.generate(["ROMEO:"], max_new_tokens=8)   # GenerationResult, pickled back
    for ev in eng.stream(["ROMEO:"], max_new_tokens=8):  # engine events, as they happen
        ...
    eng.run(my_top_level_fn, 3, emit=print)   # my_top_level_fn(engine, 3, emit=...) in the child

A refused input arrives as `EngineError` (one line), as it would from the engine itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class EngineProxy:
    """The engine's API, answered by a child process. Quick questions (`limits`, `check`, `encode`,
    `decode`) are answered even while a job runs; jobs (`generate`, `stream`, `run`) take turns."""

    def __init__(self, process: Any):
        self._process = process  # the EngineProcess that owns the child (it imports this module)

    @property
    def info(self):
        return self._process.loaded.info

    @property
    def cfg(self):
        return self._process.loaded.cfg

    def limits(self, *args, **kwargs):
        return self._process.ask("limits", args, kwargs)

    def check(self, *args, **kwargs):
        return self._process.ask("check", args, kwargs)

    def encode(self, *args, **kwargs):
        return self._process.ask("encode", args, kwargs)

    def decode(self, *args, **kwargs):
        return self._process.ask("decode", args, kwargs)

    def generate(self, *args, **kwargs):
        return self._process.job("generate", args, kwargs)

    def stream(self, *args, **kwargs) -> Iterator:
        """The engine's events; closing the iterator early cancels the request in the child."""
        return self._process.job_stream(("stream", args, kwargs))

    def run(self, fn: Callable, *args, emit: Callable[[Any], None] | None = None, **kwargs):
        """`fn(engine, *args, emit=..., **kwargs)` in the child; what it emits reaches `emit` here.

        `fn` must be a top-level function (it is pickled by module and name)."""
        result = None
        for kind, value in self._process.job_messages(("run", (fn, *args), kwargs)):
            if kind == "event":
                if emit is not None:
                    emit(value)
            else:
                result = value
        return result
