"""Reading a kitchen's /metrics from outside: what the instructor's page ("the pass") shows.

Works on our class server (`twopot:` names) and on vLLM (`vllm:` names: the same ideas under the
same names), because it reads only Prometheus text; and on llama.cpp's `llama-server --metrics`
(`llamacpp:` names, mapped below), which keeps gauges and counters but no latency histograms and
no count of finished requests: what it lacks is None, and the page says so in one line. Two scrapes make a window: percentiles come
from the histogram buckets that filled in between (as PromQL's `histogram_quantile(rate(...))`),
rates from the counters' growth.

    a = scrape("http://127.0.0.1:8000"); ...; b = scrape("http://127.0.0.1:8000")
    w = window(a, b)     # w.ttft_s["p99"], w.itl_s["p50"], w.tokens_per_s, w.running, ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.errors import EngineError

PREFIXES = ("twopot:", "vllm:", "llamacpp:")
# llama.cpp's names for the same ideas (tools/server: requests in a slot, deferred for want of one,
# tokens generated); its KV ratio only in releases that export it
ALIASES = {"llamacpp:": {"requests_processing": "num_requests_running", "requests_deferred": "num_requests_waiting",
                         "kv_cache_usage_ratio": "kv_cache_usage_perc", "tokens_predicted": "generation_tokens"}}
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
              "e2e_request_latency_seconds", "request_queue_time_seconds")  # fmt: skip


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last
    count: float
    total: float


@dataclass(frozen=True)
class Snapshot:
    t: float  # when it was taken (time.time())
    prefix: str
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


def parse(text: str, t: float | None = None) -> Snapshot:
    """Prometheus text -> Snapshot; series of one name are summed over their labels."""
    prefix = next((p for p in PREFIXES if f"\n{p}" in "\n" + text), None)
    if prefix is None:
        raise EngineError("no twopot:, vllm: or llamacpp: metrics in this /metrics page: is it a kitchen server?")
    alias = ALIASES.get(prefix, {})
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    hist: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        name = family.name[len(prefix):]
        for s in family.samples:
            if s.name.endswith("_total") and family.type != "histogram":  # a counter, however its TYPE line names it
                key = alias.get(s.name[len(prefix) : -len("_total")], s.name[len(prefix) : -len("_total")])
                counters[key] = counters.get(key, 0.0) + s.value
            elif family.type == "gauge":
                gauges[alias.get(name, name)] = gauges.get(alias.get(name, name), 0.0) + s.value
            elif family.type == "histogram":
                h = hist.setdefault(name, {"buckets": {}, "count": 0.0, "sum": 0.0})
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    h["buckets"][le] = h["buckets"].get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    h["count"] += s.value
                elif s.name.endswith("_sum"):
                    h["sum"] += s.value
    histograms = {n: Histogram(tuple(sorted(h["buckets"].items())), h["count"], h["sum"]) for n, h in hist.items()}
    return Snapshot(time.time() if t is None else t, prefix, gauges, counters, histograms)


def scrape(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> Snapshot:
    """GET url/metrics; a server that cannot be read raises EngineError with one line."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/metrics", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise EngineError(f"could not read {url}/metrics: {type(err).__name__}: {err}") from None
    if r.status_code != 200:
        raise EngineError(f"{url}/metrics answered HTTP {r.status_code}")
    return parse(r.text)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile: linear interpolation inside the bucket where the q-th observation falls."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, prev_le, prev_n = q * total, 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le  # beyond the last finite bound: the bound is all we know
            return prev_le + (le - prev_le) * (rank - prev_n) / max(n - prev_n, 1e-12)
        prev_le, prev_n = le, n
    return prev_le


@dataclass(frozen=True)
class Window:
    seconds: float
    running: float
    waiting: float
    kv_usage: float | None  # None: the server exports no KV usage
    tokens_per_s: float
    requests_per_s: float | None  # None: the server counts no finished requests (llama.cpp)
    ttft_s: dict
    itl_s: dict
    tpot_s: dict
    e2e_s: dict
    queue_s: dict
    observed: dict  # requests (or gaps, for ITL) each histogram saw in the window
    histograms: bool = True  # False: the server exports no latency histograms (llama.cpp)


def window(old: Snapshot, new: Snapshot) -> Window:
    """What happened between two scrapes (the gauges are the newer one's)."""
    dt = max(new.t - old.t, 1e-9)

    def delta(name: str) -> list[tuple[float, float]]:
        a, b = old.histograms.get(name), new.histograms.get(name)
        if b is None:
            return []
        before = dict(a.buckets) if a is not None else {}
        return [(le, n - before.get(le, 0.0)) for le, n in b.buckets]

    def pct(name: str) -> dict:
        d = delta(name)
        return {f"p{int(q * 100)}": quantile(q, d) for q in (0.5, 0.9, 0.99)}

    done = new.counters["request_success"] - old.counters.get("request_success", 0.0) \
        if "request_success" in new.counters else None  # fmt: skip
    gen = new.counters.get("generation_tokens", 0.0) - old.counters.get("generation_tokens", 0.0)
    return Window(
        seconds=dt, running=new.gauges.get("num_requests_running", 0.0),
        waiting=new.gauges.get("num_requests_waiting", 0.0),
        kv_usage=new.gauges.get("kv_cache_usage_perc", new.gauges.get("gpu_cache_usage_perc")),
        tokens_per_s=gen / dt, requests_per_s=None if done is None else done / dt,
        ttft_s=pct("time_to_first_token_seconds"), itl_s=pct("inter_token_latency_seconds"),
        tpot_s=pct("request_time_per_output_token_seconds"), e2e_s=pct("e2e_request_latency_seconds"),
        queue_s=pct("request_queue_time_seconds"),
        observed={n: (delta(n)[-1][1] if delta(n) else 0.0) for n in HISTOGRAMS},
        histograms=any(n in new.histograms for n in HISTOGRAMS),
    )  # fmt: skip
