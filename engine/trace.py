"""The per-phase trace: what every prefill and decode step cost, measured and modelled.

Each `StepRecord` is one forward pass of the engine: the single prefill pass (the wok tossing the
whole batch of prompts) or one decode step (the soup pot ladling one token per running sequence).
Times are wall-clock seconds from the start of the request (`time.perf_counter`, with a device
synchronize on GPU so the number includes the kernels, not just their launch).

`flops` and `bytes_moved` are analytic (from the model shape, not measured), so the roofline can
place each step at intensity = flops / bytes_moved and compare achieved FLOP/s and bytes/s with the
machine's measured roofs.

Derived metrics follow vLLM's benchmark definitions:
  TTFT  = time from request start to the first output token (prefill + first sampling)
  TPOT  = (E2E - TTFT) / (n - 1), n = output tokens of the longest sequence
  ITL   = the list of gaps between consecutive output tokens (one per decode step)
Worked example: prefill ends at 0.120 s, decode steps end at 0.150, 0.181, 0.210 s, so n = 4,
TTFT = 0.120, E2E = 0.210, TPOT = (0.210 - 0.120) / 3 = 0.030, ITL = [0.030, 0.031, 0.029].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from engine.config import ModelConfig
from engine.costs import step_cost

Phase = Literal["prefill", "decode", "mixed"]  # mixed: a serving step with prefill chunks and decodes


@dataclass(frozen=True)
class StepRecord:
    phase: Phase
    index: int  # 0 for prefill; 1, 2, ... for decode steps
    t_start: float  # seconds since request start
    t_end: float
    forward_s: float  # the model's forward pass alone; the rest of the step is sampling + bookkeeping
    batch: int  # sequences in this forward pass
    tokens: int  # real (non-padding) tokens processed in this pass
    slots: int  # token positions actually computed, padding included (== tokens when packed)
    kv_tokens: int  # cache positions attended to, summed over the batch
    kv_bytes: int  # KV cache bytes holding live data after this step
    flops: float  # analytic floating-point operations of this pass
    bytes_moved: float  # analytic bytes read + written (weights, KV cache, activations)
    others: int = 0  # a shared kitchen's pass: sequences of other orders it cooked too (their time is in it)

    @property
    def seconds(self) -> float:
        return self.t_end - self.t_start

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte: where the step sits on the roofline's x-axis."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_moved / self.seconds if self.seconds > 0 else 0.0


def measured_step(cfg: ModelConfig, dtype_bytes: int, *, phase: Phase, index: int, t_start: float,
                  t_end: float, forward_s: float, batch: int, tokens: int, slots: int, kv_tokens: int,
                  kv_bytes: int, logits_rows: int, attn_pairs: int | None = None,
                  quant: str | None = None) -> StepRecord:  # fmt: skip
    """A StepRecord: the pass's measured times plus its analytic cost (engine/costs.py)."""
    cost = step_cost(cfg, batch, slots, kv_tokens, dtype_bytes, logits_rows, attn_pairs, quant)
    return StepRecord(
        phase=phase, index=index, t_start=t_start, t_end=t_end, forward_s=forward_s, batch=batch,
        tokens=tokens, slots=slots, kv_tokens=kv_tokens, kv_bytes=kv_bytes,
        flops=cost.flops, bytes_moved=cost.bytes_moved,
    )  # fmt: skip


@dataclass(frozen=True)
class Metrics:
    ttft_s: float
    tpot_s: float | None  # None when only one token was generated (no gap to average)
    itl_s: list[float]
    e2e_s: float
    prefill_s: float  # the prefill forward pass alone (TTFT minus tokenization/sampling)
    prefill_tokens: int
    output_tokens: int  # summed over the batch
    prefill_tps: float | None  # prompt tokens per second of prefill (None: no prefill time measured)
    decode_tps: float | None  # generated tokens per second over the decode phase, all sequences (None: no decode)
    kv_cache_bytes: int  # peak live KV bytes
    kv_cache_allocated_bytes: int  # bytes preallocated (static cache) or peak held (growing)


@dataclass
class Trace:
    """Everything measured during one request, in order."""

    steps: list[StepRecord] = field(default_factory=list)
    t_first_token: float | None = None  # seconds since start, when token 1 was ready
    t_done: float | None = None
    notes: list[str] = field(default_factory=list)  # what ran differently than asked, one line each

    @property
    def prefill(self) -> StepRecord | None:
        return next((s for s in self.steps if s.phase == "prefill"), None)

    @property
    def decode_steps(self) -> list[StepRecord]:
        return [s for s in self.steps if s.phase == "decode"]

    def to_rows(self) -> list[dict]:
        """Plain dicts (one per step), ready for a pandas DataFrame or JSON."""
        return [asdict(s) | {"seconds": s.seconds, "intensity": s.intensity} for s in self.steps]


def compute_metrics(trace: Trace, output_tokens: list[int], kv_allocated: int) -> Metrics:
    """Derive the serving metrics from a finished trace.

    output_tokens[i] is how many tokens sequence i produced. TPOT uses the longest sequence, since
    the batch's decode phase lasts until it finishes.
    """
    pre = trace.prefill
    assert pre is not None and trace.t_first_token is not None and trace.t_done is not None
    n = max(output_tokens) if output_tokens else 0
    ttft, e2e = trace.t_first_token, trace.t_done
    token_times = [ttft] + [s.t_end for s in trace.decode_steps]
    itl = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
    decode_s = e2e - ttft
    decode_tokens = sum(output_tokens) - len(output_tokens)  # first tokens come from prefill
    return Metrics(
        ttft_s=ttft,
        tpot_s=(e2e - ttft) / (n - 1) if n > 1 else None,
        itl_s=itl,
        e2e_s=e2e,
        prefill_s=pre.seconds,
        prefill_tokens=pre.tokens,
        output_tokens=sum(output_tokens),
        prefill_tps=pre.tokens / pre.seconds if pre.seconds > 0 else None,
        decode_tps=decode_tokens / decode_s if decode_s > 0 and decode_tokens > 0 else None,
        kv_cache_bytes=max((s.kv_bytes for s in trace.steps), default=0),
        kv_cache_allocated_bytes=kv_allocated,
    )
