"""How an engine loads and serves: one typed object, checked in one place.

Every choice made when an engine is loaded lives here, so it travels as one value (the kitchen
loop's settings carry it to its process, a benchmark records it) instead of a dozen keyword
arguments passed through layers:

    Engine.load("chef")                                                 # every default
    Engine.load("chef", EngineSettings(policy="chunked", token_budget=256))
    Engine.load("chef", policy="chunked", token_budget=256)             # the same, in one line

Three groups of fields:

  the weights   `device`, `dtype` (float32 | bfloat16 | float16), `quant` (None | "int8": int8
                matmul weights, engine/quant.py); `kv_budget_bytes` the memory an order or the
                serving path may use (None: half of what is free when it is first needed)
  serving       `policy`, `token_budget`, `max_seqs`, `max_seq_len`, `kv_tokens`, `prefix_cache`
                (engine/scheduler.py explains each)
  the forward   two forwards exist, the torch model's (engine/model.py, the reference) and the
                native step (engine/native.py, one C call a pass, CPU only). `native` picks the
                native step where it runs; the torch forward's options are `compile` (pure-decode
                steps through torch.compile, engine/compiled.py; up to `compile_max_batch` rows),
                `cuda_graphs` (decode steps replayed as CUDA graphs, engine/cuda_graph.py) and
                `batch_invariant` (every request's tokens the same bits whatever its neighbours,
                engine/invariance.py). The runner dispatches once per pass (engine/runner.py).

`check()` refuses a bad value in one line before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from engine.compiled import COMPILE_MAX_BATCH, check_max_batch
from engine.errors import EngineError
from engine.quant import parse_quant, precision_parts
from engine.scheduler import SchedulerConfig


@dataclass(frozen=True)
class EngineSettings:
    device: str = "cpu"
    dtype: str = "float32"
    quant: str | None = None
    kv_budget_bytes: int | None = None
    policy: str = "continuous"
    token_budget: int = 512  # chunked: tokens per step; continuous: prompt tokens per prefill step
    max_seqs: int = 64  # sequences running at once (KV seats)
    max_seq_len: int | None = None  # a seat's slots: prompt + new tokens - 1 (None: min(context, 2048))
    kv_tokens: int = 0  # cached tokens all running sequences may hold together (0: every seat full)
    prefix_cache: bool = False  # reuse cached prompt prefixes; keep finished seats as leftovers
    native: bool = True  # the native step on CPU (engine/native.py); False: the torch forward op by op
    compile: bool = False  # the torch forward's pure-decode steps through torch.compile (engine/compiled.py)
    compile_max_batch: int = COMPILE_MAX_BATCH
    cuda_graphs: bool = True  # the torch forward's decode steps replayed as CUDA graphs (CUDA only)
    batch_invariant: bool = False  # strict sums and attention on a fixed key grid (engine/invariance.py)

    def but(self, **changes) -> EngineSettings:
        """These settings with `changes`; an unknown name is refused in one line naming the known ones.
        Example: EngineSettings().but(policy="chunked").policy == "chunked"."""
        known = {f.name for f in fields(self)}
        bad = next((k for k in changes if k not in known), None)
        if bad is not None:
            raise EngineError(f"unknown engine setting '{bad}' (known: {', '.join(sorted(known))})")
        return replace(self, **changes) if changes else self

    def check(self) -> None:
        """Refuse (EngineError, one line) a value that cannot work, before any weights are read."""
        SchedulerConfig(self.policy, self.max_seqs, self.token_budget).check()
        check_max_batch(self.compile_max_batch)
        parse_quant(self.quant)
        if self.max_seq_len is not None and (not isinstance(self.max_seq_len, int) or self.max_seq_len < 1):
            raise EngineError(f"max_seq_len must be an integer of at least 1 or None (got {self.max_seq_len!r})")
        if not isinstance(self.kv_tokens, int) or self.kv_tokens < 0:
            raise EngineError(f"kv_tokens must be 0 (every seat full) or more tokens (got {self.kv_tokens!r})")


def precision_settings(precision: str, **changes) -> EngineSettings:
    """The app's one precision word as settings: "int8" is int8 matrices over float32, any other a
    dtype. Example: precision_settings("int8").quant == "int8"; precision_settings("bfloat16").dtype."""
    dtype, quant = precision_parts(precision)
    return EngineSettings(dtype=dtype, quant=quant).but(**changes)
