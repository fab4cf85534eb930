"""What a finished request hands back: an order's `GenerationResult`, a served request's `RequestOutput`.

Both carry metrics with vLLM's definitions (engine/trace.py has the worked example):
  queue   arrival -> first scheduled into a step
  TTFT    arrival -> first token (queue + prefill, its chunks and any steps it shared)
  TPOT    (last token - first token) / (n - 1)
  ITL     the gaps between consecutive tokens
  E2E     arrival -> last token
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.speculative import SpecCounters
from engine.trace import Metrics, Trace, compute_metrics


@dataclass
class GenerationResult:
    """One order: B prompts cooked together (`Engine.generate` / `Engine.stream`)."""

    tokens: list[list[int]]  # generated ids per sequence (prompt excluded, EOS included if hit)
    texts: list[str]
    prompt_tokens: list[int]  # prompt length of each sequence
    metrics: Metrics
    trace: Trace
    settings: dict
    prompt_ids: list[list[int]] = field(default_factory=list)
    model: str = ""
    device: str = ""
    dtype: str = ""  # the precision it cooked at: a dtype, or "int8" (int8 matrices, float32 the rest)
    request_id: int = 0
    path: str = "seats"  # which code cooked it: "seats" (the engine), "fixed batch" (a lab kitchen), "class kitchen"
    reused_tokens: int = 0  # prompt tokens taken from a cached prefix, not computed (shared kitchen only)
    table_ids: tuple[int, ...] = ()  # shared kitchen: the engine's request id of each table
    reused_from: tuple[int, ...] = ()  # shared kitchen: the requests whose leftovers the tables reused

    @classmethod
    def of(cls, tokens: list[list[int]], prompts: list[list[int]], trace: Trace, kv_allocated: int,
           texts: list[str], **fields) -> GenerationResult:  # fmt: skip
        """A finished order's result: its metrics from its complete trace (`trace.t_done` set)."""
        metrics = compute_metrics(trace, [len(t) for t in tokens], kv_allocated)
        return cls(tokens, texts, [len(p) for p in prompts], metrics, trace, prompt_ids=prompts, **fields)

    def to_dict(self) -> dict:
        """JSON-ready: the metrics flattened to the top level, plus one row per traced pass."""
        out = {"tokens": self.tokens, "texts": self.texts, "prompt_tokens": self.prompt_tokens}
        out |= asdict(self.metrics)
        out |= {"settings": self.settings, "model": self.model, "device": self.device, "dtype": self.dtype,
                "path": self.path}
        out["trace"] = self.trace.to_rows()
        return out


@dataclass(frozen=True)
class RequestMetrics:
    queue_s: float
    ttft_s: float
    tpot_s: float | None  # None with fewer than two tokens (no gap to average)
    itl_s: list[float]
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int
    cached_tokens: int = 0  # prompt tokens reused from a cached prefix, not computed


@dataclass(frozen=True)
class RequestOutput:
    """One request served by the scheduler (`Engine.submit` ... its `Done`)."""

    request_id: int
    prompt_ids: list[int]
    tokens: list[int]  # generated ids (EOS included if hit)
    text: str
    finish_reason: str  # "length", "stop" or "cancelled"
    metrics: RequestMetrics | None  # None when cancelled before its first token
    speculation: SpecCounters | None = None  # drafts, drafted, accepted (per position) when it speculated


def request_metrics(arrival: float, scheduled: float | None, times: list[float], prompt_tokens: int,
                    preemptions: int, cached_tokens: int = 0) -> RequestMetrics | None:  # fmt: skip
    """Times are seconds on one clock; `times[i]` is when output token i was ready."""
    if not times:
        return None
    itl = [b - a for a, b in zip(times, times[1:], strict=False)]
    return RequestMetrics(
        queue_s=(scheduled if scheduled is not None else times[0]) - arrival,
        ttft_s=times[0] - arrival,
        tpot_s=(times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
        itl_s=itl,
        e2e_s=times[-1] - arrival,
        prompt_tokens=prompt_tokens,
        output_tokens=len(times),
        preemptions=preemptions,
        cached_tokens=cached_tokens,
    )
