"""Two kitchens: the wok in one process, the soup pot in another, the KV cache carried between them.

Prefill/decode disaggregation (DistServe, Splitwise, vLLM's P/D): the phases want different
machines, so a prefill worker cooks the prompt and ships its K/V to a decode worker, which never
stalls its pot for a long prompt. What it costs is the carrying: KV bytes per token are
2 x layers x KV heads x head dim x bytes (the chef in float32: 6,144 B), times the prompt.

Here the two kitchens are two processes on this machine joined by `torch.distributed` (gloo on
CPU), each with its own torch threads (`threads`, default 1: one core each on a 2-core machine).
A prompt's K/V travel as ONE contiguous tensor (2, layers, KV heads, prompt, head dim), so each
carrying is one message: one latency, then the bytes.

Two ways to run them:

  run_two_kitchens   orders one after another; each order's K/V crosses REPEATS times, after the
                     link is probed at sizes from 4 KB to 16 MB, REPEATS times each. Both keep the
                     fastest crossing: on shared cores a crossing can only be slowed (a process
                     not yet woken), so the minimum is the link's own time, for probes and K/V alike. The link's latency and
                     bandwidth are fitted to the probes (least squares on relative error), so
                     `predicted_transfer_s` = latency + bytes / bandwidth can be compared with the
                     measured transfer at every size. TTFT = prefill + transfer + first decode step
                     (the decode kitchen streams the order: its first bowl leaves with that step).
  run_stream         a stream of orders arriving at planned times: the wok cooks each as it
                     arrives and ships it; the pot adopts it between its own decode steps. Per
                     order: queue, prefill, handoff (wok done -> K/V received), first decode; every
                     order's inter-token latencies (the pot never tosses a prompt).
  one_kitchen_stream the same stream through one engine (the reference: its pot stalls while its
                     wok cooks each new arrival).

Clocks: `time.perf_counter()` is the system's monotonic clock, shared by both processes.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine import Engine
from engine.batching import build_batch
from engine.errors import EngineError
from engine.events import Done
from engine.kv_pool import SeatPool
from engine.model import prefill
from engine.sampling import SamplingParams, sample

PROBE_BYTES = tuple(1 << p for p in range(12, 25, 2))  # 4 KB .. 16 MB, x4 apart
REPEATS = 25  # crossings per probe size and per order's K/V in run_two_kitchens; the fastest is kept


@dataclass(frozen=True)
class DisaggregatedRun:
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
    bytes_per_s: float  # fitted: 1 / slope of time against bytes
    latency_s: float  # fitted: the intercept (one message of no bytes)
    probes: dict  # bytes -> fastest seconds of one message, "ready" handshake included

    def predict(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class StreamOrder:
    """One order of a stream, timed on the shared clock (seconds). One kitchen: handoff 0."""

    prompt_tokens: int
    arrival_s: float  # planned arrival, after the stream's start
    queue_s: float  # arrival -> its prefill starts
    prefill_s: float
    handoff_s: float  # two kitchens: prefill done -> its K/V received by the decode kitchen
    first_decode_s: float  # two kitchens: K/V received -> its first decode token (the pot's step in progress, then one)
    ttft_s: float  # arrival -> first token out of the kitchen that streams it
    itl_s: list[float]  # gaps between its decode tokens
    tokens: list[int]


def fit_link(probes: dict) -> Link:
    """Latency + bytes / bandwidth fitted to the probes, each weighted by 1 / its time: a 4 KB probe
    counts as much as a 16 MB one (plain least squares would let the big ones set the latency)."""
    sizes = np.array(sorted(probes), dtype=float)
    times = np.array([probes[int(s)] for s in sizes])
    a = np.stack([1 / times, sizes / times], axis=1)  # (P, 2): [latency, seconds per byte] -> 1
    (lat, per_byte), *_ = np.linalg.lstsq(a, np.ones_like(times), rcond=None)
    per_byte = max(per_byte, 1e-15)
    return Link(float(1 / per_byte), float(max(lat, 0.0)), probes)


def _probe(dist, sender: bool, repeats: int = REPEATS) -> Link | None:
    """Time one message of each size (after a "ready" handshake, as the orders' transfers)."""
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
        probes[size] = min(times[1:]) if times else None
    return None if sender else fit_link(probes)


def _prefill(eng, prompt, settings: dict):
    """The wok: one prefill pass over one prompt -> (ids, first token, K/V (2, L, Hkv, n, D), seconds)."""
    cfg = eng.cfg
    ids = eng.check([prompt], 2)[0]
    n = len(ids)
    t0 = time.perf_counter()
    cache = SeatPool(cfg, 1, n, eng.model.dtype, eng.device)
    logits = prefill(eng.model, build_batch([ids], "packed", eng.device, n), cache)
    params = SamplingParams(settings.get("temperature", 0.0))
    first = int(sample(logits, params, torch.Generator().manual_seed(settings.get("seed", 0)))[0])
    kv = torch.stack([cache.k[:, 0, :, :n], cache.v[:, 0, :, :n]])  # (2, L, Hkv, n, D)
    return ids, first, kv.contiguous(), time.perf_counter() - t0  # kv (2, L, Hkv, n, D)


def _recv_order(dist, eng, n: int):
    cfg = eng.cfg
    ids = torch.empty(n, dtype=torch.long)
    dist.recv(ids, src=0)
    stamps = torch.empty(3, dtype=torch.float64)
    dist.recv(stamps, src=0)
    kv = torch.empty((2, cfg.n_layers, cfg.n_kv_heads, n, cfg.head_dim), dtype=eng.model.dtype)
    return ids.tolist(), stamps.tolist(), kv


def _finish(eng, rid: int):
    result = None
    while not eng.idle:
        result = next((e.result for e in eng.step() if isinstance(e, Done) and e.request_id == rid), result)
    return result


def _kitchens_one_by_one(dist, eng, rank: int, prompts: list, max_new_tokens: int, settings: dict, out) -> None:
    link = _probe(dist, sender=rank == 0)
    if rank == 0:
        exact = []
        for prompt in prompts:
            ids, first, kv, prefill_s = _prefill(eng, prompt, settings)
            dist.send(torch.tensor([len(ids), first], dtype=torch.long), dst=1)
            dist.send(torch.tensor(ids, dtype=torch.long), dst=1)
            dist.send(torch.tensor([prefill_s, 0.0, 0.0], dtype=torch.float64), dst=1)
            for _ in range(REPEATS):
                dist.recv(torch.zeros(1), src=1)  # the decode kitchen is ready: carry the K/V now
                dist.send(kv, dst=1)
            back = torch.empty_like(kv)
            dist.recv(back, src=1)
            exact.append(bool(torch.equal(back, kv)))
        out.put(("exact", exact))
        return
    out.put(("link", link))
    per_token = eng.cfg.kv_bytes_per_token(eng.model.dtype.itemsize)
    for _ in prompts:
        header = torch.empty(2, dtype=torch.long)
        dist.recv(header, src=0)
        n, first = header.tolist()
        ids, (prefill_s, _, _), kv = _recv_order(dist, eng, n)
        times = []
        for _ in range(REPEATS):
            dist.send(torch.zeros(1), dst=0)  # ready (as in the probes): the clock starts now
            t0 = time.perf_counter()
            dist.recv(kv, src=0)
            times.append(time.perf_counter() - t0)
        transfer_s = min(times)
        dist.send(kv, dst=0)  # back again: the round trip is checked bit for bit
        t_adopt = time.perf_counter()
        result = _finish(eng, eng.adopt(ids, first, kv[0], kv[1], max_new_tokens, **settings))
        first_decode = result.metrics.itl_s[0] if result.metrics.itl_s else time.perf_counter() - t_adopt
        kv_bytes = per_token * n  # per token: K and V of every layer
        out.put(("run", dict(
            tokens=result.tokens, text=result.text, prompt_tokens=n, kv_bytes=kv_bytes, kv_bytes_per_token=per_token,
            prefill_s=prefill_s, transfer_s=transfer_s, first_decode_s=first_decode,
            ttft_s=prefill_s + transfer_s + first_decode, tpot_s=result.metrics.tpot_s,
            predicted_transfer_s=link.predict(kv_bytes),
        )))  # fmt: skip


def _kitchens_stream(dist, eng, rank: int, orders: list, max_new_tokens: int, settings: dict, out) -> None:
    """The wok cooks each order at its arrival; the pot adopts it between decode steps."""
    start = torch.tensor([time.perf_counter() + 0.05], dtype=torch.float64)
    dist.broadcast(start, src=0)  # both kitchens count arrivals from the same instant
    t0 = float(start[0])
    if rank == 0:
        for prompt, arrival in orders:
            time.sleep(max(0.0, t0 + arrival - time.perf_counter()))
            t_start = time.perf_counter()
            ids, first, kv, _ = _prefill(eng, prompt, settings)
            t_end = time.perf_counter()
            dist.send(torch.tensor([len(ids), first], dtype=torch.long), dst=1)
            dist.send(torch.tensor(ids, dtype=torch.long), dst=1)
            dist.send(torch.tensor([t0 + arrival, t_start, t_end], dtype=torch.float64), dst=1)
            dist.send(kv, dst=1)
        return
    inbox: queue.Queue = queue.Queue()

    def receive() -> None:
        """The kitchen door, in its own thread. (gloo's irecv never showed completed until waited on,
        so the pot noticed an order only when it ran dry; a blocking recv here hands it over at once.)"""
        for _ in orders:
            header = torch.empty(2, dtype=torch.long)
            dist.recv(header, src=0)
            n, first = header.tolist()
            ids, stamps, kv = _recv_order(dist, eng, n)
            dist.recv(kv, src=0)
            inbox.put((ids, first, stamps, kv, time.perf_counter()))

    threading.Thread(target=receive, name="decode-kitchen-door", daemon=True).start()
    meta, results = {}, {}
    while len(results) < len(orders):
        if len(meta) < len(orders) and (eng.idle or not inbox.empty()):
            ids, first, stamps, kv, t_recv = inbox.get()
            rid = eng.adopt(ids, first, kv[0], kv[1], max_new_tokens, **settings)
            meta[rid] = (len(meta), len(ids), *stamps, t_recv, time.perf_counter())
            continue
        results |= {e.request_id: e.result for e in eng.step() if isinstance(e, Done)}
    for rid, (i, n, arrival, t_start, t_end, t_recv, t_adopt) in meta.items():
        r = results[rid]
        first_decode = t_adopt - t_recv + r.metrics.itl_s[0]  # waits for the pot's step in progress, then one
        out.put(("order", i, StreamOrder(
            n, orders[i][1], t_start - arrival, t_end - t_start, t_recv - t_end, first_decode,
            t_recv + first_decode - arrival, r.metrics.itl_s[1:], r.tokens,
        )))  # fmt: skip


def _warm_up(eng, prompt) -> None:
    """One untimed prefill and a few serving steps: the first pass of each kind pays one-time costs."""
    _prefill(eng, prompt, {})
    _finish(eng, eng.submit(eng.check([prompt], 2)[0], 3, stop_at_eos=False))


def _worker(rank: int, init: str, mode: str, model: str, orders: list, max_new_tokens: int, dtype: str,
            threads: int, settings: dict, out):  # fmt: skip
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        eng = Engine.load(model, dtype=dtype, policy="continuous")
        _warm_up(eng, orders[0][0] if mode == "stream" else orders[0])
        dist.barrier()  # both kitchens loaded and warm: nothing below pays a first-call cost
        run = _kitchens_stream if mode == "stream" else _kitchens_one_by_one
        run(dist, eng, rank, orders, max_new_tokens, settings, out)
        dist.barrier()  # the wok leaves only once the pot has everything it sent
        out.put(("done", rank))
    except Exception as err:  # noqa: BLE001 -- the parent reports one line
        out.put(("error", " ".join(f"{type(err).__name__}: {err}".split())))
    finally:
        dist.destroy_process_group()


def _two_processes(mode: str, model: str, orders: list, max_new_tokens: int, dtype: str, threads: int,
                   timeout_s: float, settings: dict) -> list:  # fmt: skip
    """Start both kitchens, collect what they put on the queue until both say done."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    got, done = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        args = (init, mode, model, orders, max_new_tokens, dtype, threads, settings, out)
        procs = [ctx.Process(target=_worker, args=(r, *args)) for r in (0, 1)]
        for p in procs:
            p.start()
        deadline = time.time() + timeout_s
        try:
            while len(done) < 2:
                try:
                    item = out.get(timeout=1.0)
                except queue.Empty:  # a kitchen that died says nothing: notice it now, not at the deadline
                    _check_alive(procs, done, deadline, timeout_s)
                    continue
                if item[0] == "error":
                    raise EngineError(f"a kitchen failed: {item[1]}")
                if item[0] == "done":
                    done.add(item[1])
                else:
                    got.append(item)
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
    return got


def _check_alive(procs: list, done: set, deadline: float, timeout_s: float) -> None:
    """Raise one line if a kitchen process ended before saying done, or the deadline passed."""
    for rank, p in enumerate(procs):
        if rank not in done and p.exitcode not in (None, 0):  # 0: it said done, the word is on its way
            raise EngineError(f"the {('prefill', 'decode')[rank]} kitchen's process ended (exit code {p.exitcode}) "
                              "before it finished")  # fmt: skip
    if time.time() > deadline:
        raise EngineError(f"the two kitchens did not finish within {timeout_s:,.0f} s")


def run_two_kitchens(model: str, prompts: list, max_new_tokens: int = 32, dtype: str = "float32",
                     timeout_s: float = 600.0, threads: int = 1, **settings) -> tuple[list[DisaggregatedRun], Link]:  # fmt: skip
    """Serve `prompts` one after another through a prefill kitchen and a decode kitchen."""
    got = _two_processes("one_by_one", model, list(prompts), max_new_tokens, dtype, threads, timeout_s, settings)
    runs = [v for kind, v in got if kind == "run"]
    exact = next(v for kind, v in got if kind == "exact")
    link = next(v for kind, v in got if kind == "link")
    return [DisaggregatedRun(**r, round_trip_exact=e) for r, e in zip(runs, exact, strict=True)], link


def run_stream(model: str, orders: list[tuple], max_new_tokens: int = 32, dtype: str = "float32",
               timeout_s: float = 600.0, threads: int = 1, **settings) -> list[StreamOrder]:  # fmt: skip
    """`orders`: (prompt, arrival seconds after the start) in arrival order; greedy unless settings say."""
    got = _two_processes("stream", model, list(orders), max_new_tokens, dtype, threads, timeout_s, settings)
    return [o for _, _, o in sorted(got, key=lambda item: item[1])]


def one_kitchen_stream(eng, orders: list[tuple], max_new_tokens: int = 32, **settings) -> list[StreamOrder]:
    """The same stream through one engine: arrivals are submitted as their time comes, between steps."""
    t0 = time.perf_counter() + 0.05
    waiting, ids, results = list(orders), [], {}
    while waiting or not eng.idle:
        while waiting and time.perf_counter() >= t0 + waiting[0][1]:
            prompt, arrival = waiting.pop(0)
            ids.append(eng.submit(prompt, max_new_tokens, arrival_s=t0 + arrival, **settings))
        if eng.idle:
            time.sleep(max(0.0, t0 + waiting[0][1] - time.perf_counter()))
            continue
        results |= {e.request_id: e.result for e in eng.step() if isinstance(e, Done)}
    out = []
    for rid, (_, arrival) in zip(ids, orders, strict=True):
        m, r = results[rid].metrics, results[rid]
        out.append(StreamOrder(m.prompt_tokens, arrival, m.queue_s, m.ttft_s - m.queue_s, 0.0, 0.0, m.ttft_s,
                               m.itl_s[1:], r.tokens))  # fmt: skip
    return out
