"""Is a serving decode step as fast as the fixed-batch decode step at the same batch?

The serving path pays for its freedom (any sequence may join or leave at any step) with a little
bookkeeping per step: the scheduler's plan, the seats' write index, the per-row mask. This
measures whether that shows, end to end and wall-clock, the way a user feels it:

  fixed    the batch as one order: the wall time of its n - 1 decode steps after the prefill,
           divided by n - 1
  order    the same order through `generate()`, which cooks it on seats (engine/request_group.py):
           its own clock's (done - first token) / (n - 1), `metrics.tpot_s`
  serving  B requests submitted together, stepped until every one has its first token (prefill
           may take several steps under the token budget), then the wall time of the decode steps
           until they finish, divided by their number

Each side times its decode steps directly. Subtracting a 1-token run from an n-token run would
cancel the setup too, but on a small model 63 steps take a few milliseconds, and one stall of the
machine in either run can make that difference zero or negative.

All three run the same prompts (B x 40 tokens) and n new tokens, interleaved, median of repeats,
and the same forward: the torch forward op by op, the one forward the fixed path can run. The
native step (engine/native.py) is a faster forward, not a cheaper bookkeeping, and would hide
what this asks; its speed is `python -m engine bench`'s.
The fixed path is timed twice in each round (A/A): how far two runs of the same code differ is
the noise a serving / fixed ratio must be read against.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from engine.batching import build_batch
from engine.bench.roofline import synchronize
from engine.engine import Engine
from engine.events import Token
from engine.kv_pool import SeatPool
from engine.model import decode_one_token, prefill


@dataclass(frozen=True)
class DecodeStepTiming:
    batch: int
    fixed_ms: float
    serving_ms: float
    fixed_again_ms: float  # the fixed path a second time in each round (A/A)
    order_ms: float  # the same order through generate(), which cooks it on seats (the Kitchen's path)
    forward: str  # the forward all three ran, in the Kitchen's words (serving_core.describe_decode_step)

    @property
    def ratio(self) -> float:
        """serving / fixed: at most 1.0 means the serving step is no slower."""
        return self.serving_ms / self.fixed_ms

    @property
    def order_ratio(self) -> float:
        """order on seats / fixed: the Kitchen's order on the serving core against the fixed batch."""
        return self.order_ms / self.fixed_ms

    @property
    def aa_ratio(self) -> float:
        """fixed (second) / fixed: the same code against itself."""
        return self.fixed_again_ms / self.fixed_ms


def _fixed(engine: Engine, prompts: list[list[int]], n: int) -> float:
    """The order as one fixed batch, greedy: the wok, then n - 1 decode steps of the same forward
    over seats 0..B-1 with one common slot per step (generate() itself cooks the order on seats).
    Returns the seconds per decode step."""
    dev, B = engine.device, len(prompts)
    pre = build_batch(prompts, "padded", dev, max(map(len, prompts)) + n)
    pool = SeatPool(engine.cfg, B, pre.valid.shape[1], engine.model.dtype, dev)
    with torch.inference_mode():
        tok = prefill(engine.model, pre, pool).argmax(-1)[:, None]  # (B, 1)
        synchronize(dev)
        t = time.perf_counter()
        valid = pre.valid.clone()  # (B, S) slots holding real keys
        for slot in range(pre.slots_used, pre.slots_used + n - 1):
            valid[:, slot] = True
            mask = valid[:, None, None, : slot + 1]  # (B, 1, 1, S)
            positions = torch.full((B, 1), slot, device=dev)  # (B, 1): equal lengths, no padding
            logits = decode_one_token(engine.model, tok, positions, torch.tensor([slot], device=dev), mask, pool)
            tok = logits.argmax(-1)[:, None]  # (B, 1)
        synchronize(dev)
    return (time.perf_counter() - t) / (n - 1)


def _order(engine: Engine, prompts: list[list[int]], n: int) -> float:
    return engine.generate(prompts, max_new_tokens=n, stop_at_eos=False).metrics.tpot_s


def _serving(engine: Engine, prompts: list[list[int]], n: int) -> float:
    for p in prompts:
        engine.submit(p, n, stop_at_eos=False)
    first = 0
    while first < len(prompts):  # the prefill steps: not timed
        first += sum(isinstance(ev, Token) and ev.step == 0 for ev in engine.step())
    steps, t = 0, time.perf_counter()
    while not engine.idle:
        engine.step()
        steps += 1
    return (time.perf_counter() - t) / steps


def time_decode_step(engine: Engine, batch: int, new_tokens: int = 64, repeats: int = 5) -> DecodeStepTiming:
    """`engine` must use a policy that prefills all B prompts in one step (static or continuous)."""
    if new_tokens < 2:
        raise ValueError(f"a decode step needs at least 2 new tokens (got {new_tokens})")
    torch_forward = engine.settings.but(native=False, compile=False, cuda_graphs=False)
    engine = Engine(engine.model, engine.codec, engine.info, torch_forward)  # the fixed path's forward for all three
    prompts = [[(7 * i + j) % engine.cfg.vocab_size for j in range(40)] for i in range(batch)]
    _fixed(engine, prompts, new_tokens), _serving(engine, prompts, new_tokens)  # warm-up, both paths
    _order(engine, prompts, new_tokens)
    fixed, serving, again, order = [], [], [], []
    for _ in range(repeats):
        fixed.append(_fixed(engine, prompts, new_tokens))
        serving.append(_serving(engine, prompts, new_tokens))
        order.append(_order(engine, prompts, new_tokens))
        again.append(_fixed(engine, prompts, new_tokens))
    med = statistics.median
    return DecodeStepTiming(batch, med(fixed) * 1e3, med(serving) * 1e3, med(again) * 1e3, med(order) * 1e3,
                            engine.info.decode_step)
