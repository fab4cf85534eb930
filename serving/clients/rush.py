"""A rush bigger than the room, and a student who reads slowly: the class kitchen's overload scenarios.

Both drive a running server on loopback (tests/test_class_rush.py asserts on them,
scripts/class_rush.py records them in docs/benchmarks/class-server-cpu.md):

  rush         `clients` streaming requests sent at once (greedy; a few distinct prompts, so every
               answer can be checked against the same prompt served alone afterwards). Each one is
               answered in full or refused at once (503, Retry-After, one line); nothing else.
  slow reader  one client opens a stream of `tables` long answers and reads it a few hundred bytes
               at a time while a class of `others` orders and is answered; its tables must finish
               in the engine while it is still far behind, and its answers, read at last, must be
               the same as served alone.

Bounded: at most 2,000 clients, a deadline on everything, loopback only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx

from engine.workload import percentiles
from serving.clients.loadgen import Outcome, rss_kb, run_load, serve_alone

MAX_CLIENTS = 2000
PROMPTS = ("ROMEO:", "JULIET:", "NURSE:", "MERCUTIO:", "TYBALT:", "FRIAR LAURENCE:", "CAPULET:", "BENVOLIO:")


@dataclass(frozen=True)
class RushReport:
    clients: int
    answered: int  # streamed in full, status 200
    refused: int  # 503 at once
    errors: list[str]  # anything else (should be empty)
    mismatches: int  # answered, but not what the same prompt alone gets
    refusal_lines: list[str]  # the distinct 503 lines (one line each)
    retry_after: list[str]  # the distinct Retry-After values
    refused_in_s: dict  # request sent -> 503 received
    ttft_s: dict  # of the answered, at the client
    e2e_s: dict
    duration_s: float
    rss_kb_before: int  # the server and its engine process, before the rush
    rss_kb_after: int
    running_after: float  # twopot:num_requests_running once it is over


def allow_open_files(n: int = 2 * MAX_CLIENTS + 256) -> int:
    """Raise this process's soft limit on open files towards `n` (a rush holds a socket per client, and a
    server started after this inherits it); many machines start at 1,024. Returns the limit now."""
    import resource  # lazy: POSIX only; the rush raises the open-files limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(f"twopot:{name}{{"))


def rush(url: str, pid: int, clients: int, max_tokens: int = 8, timeout_s: float = 300.0) -> RushReport:
    """`clients` streams at once against the server at `url` (process `pid`, for its memory)."""
    _check(url, clients)
    if allow_open_files() < clients + 64:
        raise ValueError(f"this process may open too few files for {clients:,} clients (ulimit -n)")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
    asyncio.run(run_load(url, "chef", list(PROMPTS), [0.0] * len(PROMPTS), len(PROMPTS), max_tokens, None, 60))
    before = rss_kb(pid)
    t0 = time.perf_counter()
    outs = asyncio.run(run_load(url, "chef", prompts, [0.0] * clients, clients, max_tokens, None, timeout_s))
    duration = time.perf_counter() - t0
    alone = {o.prompt: o for o in asyncio.run(serve_alone(url, "chef", list(PROMPTS), max_tokens, None, 60))}
    after = rss_kb(pid)
    ok = [o for o in outs if o.status == 200 and o.error is None and o.done is not None]
    refused = [o for o in outs if o.status == 503]
    others = [o for o in outs if o not in ok and o not in refused]
    return RushReport(
        clients=clients, answered=len(ok), refused=len(refused), errors=sorted({o.error or "?" for o in others})[:5],
        mismatches=sum(o.text != alone[o.prompt].text or alone[o.prompt].error is not None for o in ok),
        refusal_lines=sorted({_line(o) for o in refused}), retry_after=sorted({o.retry_after or "" for o in refused}),
        refused_in_s=percentiles([o.answered - o.sent for o in refused]),
        ttft_s=percentiles([o.chunk_times[0] - o.sent for o in ok if o.chunk_times]),
        e2e_s=percentiles([o.done - o.sent for o in ok]), duration_s=duration,
        rss_kb_before=before, rss_kb_after=after, running_after=gauge(url, "num_requests_running"),
    )  # fmt: skip


def _line(o: Outcome) -> str:
    try:
        return json.loads(o.error.split(": ", 1)[1])["error"]["message"]
    except (ValueError, KeyError, IndexError, AttributeError):
        return o.error or ""


def _check(url: str, clients: int) -> None:
    if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"the rush drives loopback servers only (got {url})")
    if not 1 <= clients <= MAX_CLIENTS:
        raise ValueError(f"clients must be 1..{MAX_CLIENTS:,} (got {clients})")


@dataclass(frozen=True)
class SlowReport:
    tables: int
    others: int
    others_answered: int
    others_mismatches: int
    others_ttft_s: dict
    read_when_others_done: int  # bytes the slow client had read when the others were all answered
    read_when_engine_done: int  # ... when its own tables had all finished in the engine
    total_bytes: int  # its whole stream
    slow_mismatches: int  # its tables' answers against the prompt alone
    engine_done_s: float  # its request -> its tables all finished in the engine
    read_done_s: float  # its request -> it had read the whole stream


def slow_reader(url: str, tables: int = 8, max_tokens: int = 400, others: int = 30, bite: int = 256,
                every_s: float = 0.05, timeout_s: float = 300.0) -> SlowReport:  # fmt: skip
    """One client reads `bite` bytes every `every_s` of a stream of `tables` x `max_tokens` tokens (its
    socket's receive buffer made small, so the server cannot push the stream ahead into the kernel)."""
    _check(url, others)
    host, port = urlparse(url).hostname, urlparse(url).port
    success0 = gauge(url, "request_success_total")
    body = json.dumps({"model": "chef", "prompt": "ROMEO:", "max_tokens": max_tokens, "n": tables,
                       "temperature": 0, "stream": True}).encode()  # fmt: skip
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.settimeout(timeout_s)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
    t0 = time.perf_counter()
    received = bytearray()
    fast = threading.Event()
    marks: dict[str, float] = {}

    def read() -> None:
        while True:
            chunk = sock.recv(bite if not fast.is_set() else 1 << 16)
            if not chunk:
                return
            received.extend(chunk)
            if not fast.is_set():
                time.sleep(every_s)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    class_prompts = [f"{i} {PROMPTS[i % len(PROMPTS)]}" for i in range(others)]
    outs = asyncio.run(run_load(url, "chef", class_prompts, [0.0] * others, others, 16, None, timeout_s))
    read_at_others = len(received)
    deadline = time.monotonic() + timeout_s
    while gauge(url, "request_success_total") < success0 + others + tables and time.monotonic() < deadline:
        time.sleep(0.05)
    marks["engine"], read_at_engine = time.perf_counter() - t0, len(received)
    fast.set()
    reader.join(timeout_s)
    marks["read"] = time.perf_counter() - t0
    sock.close()
    alone = asyncio.run(serve_alone(url, "chef", ["ROMEO:"], max_tokens, None, 120))
    texts = _texts(bytes(received), tables)
    cut = {o.prompt: o.text for o in asyncio.run(serve_alone(url, "chef", class_prompts, 16, None, 120))}
    ok = [o for o in outs if o.status == 200 and o.error is None and o.done is not None]
    return SlowReport(
        tables=tables, others=others, others_answered=len(ok), others_mismatches=sum(o.text != cut[o.prompt] for o in ok),
        others_ttft_s=percentiles([o.chunk_times[0] - o.sent for o in ok if o.chunk_times]),
        read_when_others_done=read_at_others, read_when_engine_done=read_at_engine, total_bytes=len(received),
        slow_mismatches=sum(t != alone[0].text for t in texts) + (tables - len(texts)),
        engine_done_s=marks["engine"], read_done_s=marks["read"],
    )  # fmt: skip


def _texts(raw: bytes, tables: int) -> list[str]:
    """The texts of each choice in a raw HTTP/1.1 SSE response (chunked transfer encoding undone)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = bytearray()
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        body += rest[:n]
        rest = rest[n + 2 :]
    texts = [""] * tables
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:]).get("choices", []):
                texts[c["index"]] += c.get("text", "")
    return texts
