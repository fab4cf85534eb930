"""Two kitchens: the wok in one process, the soup pot in another, the KV cache carried between them.

Prefill/decode disaggregation (DistServe, Splitwise, vLLM's P/D): the phases want different
machines, so a prefill worker cooks the prompt and ships its K/V to a decode worker, which never
stalls its pot for a long prompt. What it costs is the carrying: KV bytes per token are
2 x layers x KV heads x head dim x bytes (the chef in float32: 6,144 B), times the prompt.

Here the two kitchens are two processes on this machine joined by `torch.distributed` (gloo on
CPU; NCCL between two GPUs), and everything is measured:

  prefill_s        the prefill kitchen's pass over the prompt and its first-token sampling
  transfer_s       from the decode kitchen saying "ready" to its receipt of the last K/V byte
  first_decode_s   the decode kitchen's first step after adopting the request
  ttft_s           prefill + transfer + first decode step: when the order's first token leaves
                   the decode kitchen, which streams the order
  link             the link, measured with probe transfers before the orders: its latency (a 4 KB
                   message) and bandwidth (16 MB), so latency + bytes / bandwidth predicts each
                   order's transfer (compared in the report)

Each order's K/V is carried REPEATS times and transfer_s is the median: on a busy machine a single
transfer can wait a scheduler tick for the other process to wake, which says nothing of the link.

    results = run_two_kitchens("chef", ["ROMEO:", "JULIET:"], max_new_tokens=32)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

PROBE_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 24)  # 4 KB (the latency), 64 KB, 1 MB, 16 MB (the bandwidth)
REPEATS = 5  # each order's K/V crosses this many times; its transfer_s is the median


@dataclass(frozen=True)
class KitchenRun:
    tokens: list[int]
    text: str
    prompt_tokens: int
    kv_bytes: int
    kv_bytes_per_token: int
    prefill_s: float
    transfer_s: float
    first_decode_s: float
    ttft_s: float
    tpot_s: float | None
    predicted_transfer_s: float  # the link's latency + kv_bytes / its bandwidth
    round_trip_exact: bool  # the K/V sent back to the prefill kitchen equal what it sent, bit for bit


@dataclass(frozen=True)
class Link:
    bytes_per_s: float  # from the largest probe
    latency_s: float  # the smallest probe's time
    probes: dict  # bytes -> median seconds

    def predict(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


def _prefill_kitchen(model: str, prompts: list, dtype: str, settings: dict, out) -> None:
    import torch
    import torch.distributed as dist

    from engine import Engine
    from engine.batching import build_batch
    from engine.cache import StaticKVCache
    from engine.model import prefill
    from engine.sampling import SamplingParams, sample

    eng = Engine.load(model, dtype=dtype)
    cfg = eng.cfg
    _probe(dist, sender=True)
    exact = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = eng.check([prompt], 2)[0]
            n = len(ids)
            t0 = time.perf_counter()
            cache = StaticKVCache(cfg.n_layers, 1, cfg.n_kv_heads, cfg.head_dim, n, eng.model.dtype, eng.device)
            logits = prefill(eng.model, build_batch([ids], "packed", eng.device, n), cache)
            params = SamplingParams(settings.get("temperature", 0.0))
            first = int(sample(logits, params, torch.Generator().manual_seed(settings.get("seed", 0)))[0])
            k = torch.stack([cache.k[i][0, :, :n] for i in range(cfg.n_layers)]).contiguous()  # (L, Hkv, n, D)
            v = torch.stack([cache.v[i][0, :, :n] for i in range(cfg.n_layers)]).contiguous()
            prefill_s = time.perf_counter() - t0
            dist.send(torch.tensor([n, first], dtype=torch.long), dst=1)  # the header, then the order's ids
            dist.send(torch.tensor(ids, dtype=torch.long), dst=1)
            dist.send(torch.tensor([prefill_s], dtype=torch.float64), dst=1)
            for _ in range(REPEATS):
                dist.recv(torch.zeros(1), src=1)  # the decode kitchen is ready: carry the K/V now
                dist.send(k, dst=1)
                dist.send(v, dst=1)
            back_k, back_v = torch.empty_like(k), torch.empty_like(v)
            dist.recv(back_k, src=1)
            dist.recv(back_v, src=1)
            exact.append(bool(torch.equal(back_k, k) and torch.equal(back_v, v)))
    out.put(("exact", exact))


def _decode_kitchen(model: str, n_prompts: int, max_new_tokens: int, dtype: str, settings: dict, out) -> None:
    import torch
    import torch.distributed as dist

    from engine import Engine
    from engine.events import Done, StepEnd

    eng = Engine.load(model, dtype=dtype, policy="continuous")
    cfg = eng.cfg
    link = _probe(dist, sender=False)
    out.put(("link", link))
    per_token = cfg.kv_bytes_per_token(eng.model.dtype.itemsize)
    for _ in range(n_prompts):
        header = torch.empty(2, dtype=torch.long)
        dist.recv(header, src=0)
        n, first = int(header[0]), int(header[1])
        ids_t = torch.empty(n, dtype=torch.long)
        dist.recv(ids_t, src=0)
        ids = ids_t.tolist()
        prefill_s = torch.empty(1, dtype=torch.float64)
        dist.recv(prefill_s, src=0)
        shape = (cfg.n_layers, cfg.n_kv_heads, n, cfg.head_dim)
        k = torch.empty(shape, dtype=eng.model.dtype)
        v = torch.empty(shape, dtype=eng.model.dtype)
        times = []
        for _ in range(REPEATS):
            dist.send(torch.zeros(1), dst=0)  # ready (as in the probes): the clock starts now
            t0 = time.perf_counter()
            dist.recv(k, src=0)
            dist.recv(v, src=0)
            times.append(time.perf_counter() - t0)
        transfer_s = statistics.median(times)
        dist.send(k, dst=0)  # back again: the round trip is checked bit for bit
        dist.send(v, dst=0)
        rid = eng.adopt(ids, first, k, v, max_new_tokens, **settings)
        steps, result = [], None
        while not eng.idle:
            for ev in eng.step():
                if isinstance(ev, StepEnd):
                    steps.append(ev.step.seconds)
                elif isinstance(ev, Done) and ev.request_id == rid:
                    result = ev.result
        kv_bytes = per_token * n  # per token: K and V of every layer
        out.put(("run", dict(
            tokens=result.tokens, text=result.text, prompt_tokens=n, kv_bytes=kv_bytes, kv_bytes_per_token=per_token,
            prefill_s=float(prefill_s[0]), transfer_s=transfer_s, first_decode_s=steps[0],
            ttft_s=float(prefill_s[0]) + transfer_s + steps[0], tpot_s=result.metrics.tpot_s,
            predicted_transfer_s=link.predict(kv_bytes),
        )))  # fmt: skip


def _probe(dist, sender: bool, repeats: int = 5) -> Link | None:
    """Time transfers of a few sizes over the link; the receiver reports the medians."""
    import torch

    probes = {}
    for size in PROBE_BYTES:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        times = []
        for _ in range(repeats + 1):  # the first transfer of a size sets up buffers: not counted
            if sender:
                dist.recv(torch.zeros(1), src=1)  # go
                dist.send(buf, dst=1)
            else:
                dist.send(torch.zeros(1), dst=0)
                t0 = time.perf_counter()
                dist.recv(buf, src=0)
                times.append(time.perf_counter() - t0)
        probes[size] = statistics.median(times[1:]) if times else None
    if sender:
        return None
    largest = PROBE_BYTES[-1]
    return Link(largest / probes[largest], probes[PROBE_BYTES[0]], probes)


def _worker(rank: int, init: str, model: str, prompts: list, max_new_tokens: int, dtype: str, settings: dict, out):
    import torch.distributed as dist

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        if rank == 0:
            _prefill_kitchen(model, prompts, dtype, settings, out)
        else:
            _decode_kitchen(model, len(prompts), max_new_tokens, dtype, settings, out)
    except Exception as err:  # noqa: BLE001 -- the parent reports one line
        out.put(("error", " ".join(f"{type(err).__name__}: {err}".split())))
    finally:
        dist.destroy_process_group()


def run_two_kitchens(model: str, prompts: list, max_new_tokens: int = 32, dtype: str = "float32",
                     timeout_s: float = 600.0, **settings) -> tuple[list[KitchenRun], Link]:  # fmt: skip
    """Serve `prompts` one after another through a prefill kitchen and a decode kitchen."""
    import torch.multiprocessing as mp

    from engine.errors import EngineError

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        procs = [ctx.Process(target=_worker, args=(r, init, model, prompts, max_new_tokens, dtype, settings, out))
                 for r in (0, 1)]  # fmt: skip
        for p in procs:
            p.start()
        runs, link, exact = [], None, None
        deadline = time.time() + timeout_s
        try:
            while len(runs) < len(prompts) or exact is None or link is None:
                kind, value = out.get(timeout=max(1.0, deadline - time.time()))
                if kind == "error":
                    raise EngineError(f"a kitchen failed: {value}")
                if kind == "run":
                    runs.append(value)
                elif kind == "link":
                    link = value
                else:
                    exact = value
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
    return [KitchenRun(**r, round_trip_exact=e) for r, e in zip(runs, exact, strict=True)], link
