"""What every way of cooking one order shares: the order itself, its clock, and its result.

An order is B prompts cooked together and followed as one (`Engine.generate` / `Engine.stream`).
The engine cooks it over KV seats (engine/order_run.py); the lab's other kitchens (a growing
cache, no cache, a padded batch: lab/kitchens.py) subclass `OrderRun` too, so every kitchen hands
back the same events and the same `GenerationResult`, built here.

Honest timing: the clock pauses while the consumer handles an event (a UI may take milliseconds
to draw), so TTFT, TPOT and ITL measure the engine, not the page. On CUDA every measured point
is taken after `torch.cuda.synchronize()`, so the numbers include the kernels, not their launch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict

import torch

from engine.events import Event
from engine.limits import RequestSettings
from engine.loader import ModelInfo
from engine.model import Transformer
from engine.results import GenerationResult
from engine.text import TextCodec
from engine.trace import Trace, compute_metrics


class Clock:
    """Seconds since the request started, minus the time the consumer held an event."""

    def __init__(self, device: torch.device):
        self.device, self.t0, self.paused_s = device, time.perf_counter(), 0.0

    def now(self, sync: bool = True) -> float:
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0 - self.paused_s

    def emit(self, events: list[Event]) -> Iterator[Event]:
        for ev in events:
            held = time.perf_counter()
            yield ev
            self.paused_s += time.perf_counter() - held


class OrderRun:
    """One order on `model`: iterate `events()` once. Subclasses write `_run()`."""

    path = ""  # which kitchen cooked it, for GenerationResult.path

    def __init__(self, model: Transformer, codec: TextCodec | None, info: ModelInfo, prompts: list[list[int]],
                 req: RequestSettings, request_id: int):  # fmt: skip
        self.model, self.codec, self.info = model, codec, info
        self.cfg, self.device = model.cfg, model.device
        self.prompts, self.req, self.request_id = prompts, req, request_id

    def events(self) -> Iterator[Event]:
        return self._run()

    def _run(self) -> Iterator[Event]:
        raise NotImplementedError

    def _result(self, tokens: list[list[int]], trace: Trace, kv_allocated: int) -> GenerationResult:
        """The order's result once its trace is complete (`trace.t_done` set)."""
        return GenerationResult(
            tokens=tokens,
            texts=[self.codec.decode(t) if self.codec is not None else "" for t in tokens],
            prompt_tokens=[len(p) for p in self.prompts],
            metrics=compute_metrics(trace, [len(t) for t in tokens], kv_allocated),
            trace=trace,
            settings=asdict(self.req),
            prompt_ids=self.prompts,
            model=self.info.name,
            device=str(self.device),
            dtype=self.info.precision,
            request_id=self.request_id,
            path=self.path,
        )
