"""What the class kitchen exposes at GET /metrics, in Prometheus' text format.

vLLM's names wherever the idea is the same (so an instructor's existing Grafana panels and
PromQL work), under our own prefix `twopot:` instead of `vllm:`:

    twopot:time_to_first_token_seconds          histogram  arrival -> first token
    twopot:inter_token_latency_seconds          histogram  gap between a request's tokens
    twopot:request_time_per_output_token_seconds histogram TPOT per finished request
    twopot:e2e_request_latency_seconds          histogram  arrival -> last token
    twopot:request_queue_time_seconds           histogram  arrival -> first scheduled
    twopot:num_requests_running / _waiting      gauge      the scheduler, after the last step
    twopot:kv_cache_usage_perc                  gauge      0..1 of the KV memory in use
    twopot:prompt_tokens_total, generation_tokens_total    counter
    twopot:request_success_total{finished_reason}           counter
    twopot:prefix_cache_queries_total, prefix_cache_hits_total  counter  prompt tokens looked up / found
    twopot:request_refused_total                            counter  refused at once: the line was full (503)
and the kitchen's own per-phase series:
    twopot:step_seconds{phase="prefill|decode|mixed"}       histogram  one engine step
    twopot:step_tokens_total{phase, kind="prefill|decode"}  counter

Buckets: vLLM's smallest ITL bucket is 10 ms, so a 3 ms decode step lands in it and no p99 below
10 ms can be read. Ours start at 0.5 ms and are spaced about 1.5x apart up to a minute, so
`histogram_quantile` resolves the soup pot's milliseconds and the wok's seconds alike.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.results import RequestOutput
from serving.host.wire import QueueState, StepInfo

PREFIX = "twopot:"
BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
           0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HostMetrics:
    """One registry per server (tests run several servers in one process)."""

    def __init__(self, model: str):
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model}

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=BUCKETS, registry=r).labels(**labels)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token, from arrival.")
        self.itl = hist("inter_token_latency_seconds", "Gap between consecutive tokens of a request.")
        self.tpot = hist("request_time_per_output_token_seconds", "Time per output token after the first.")
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to last token.")
        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduled into a step.")
        self.running = Gauge(PREFIX + "num_requests_running", "Requests in the running batch.", ["model_name"],
                             registry=r).labels(**labels)  # fmt: skip
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for a seat.", ["model_name"],
                             registry=r).labels(**labels)  # fmt: skip
        self.kv_usage = Gauge(PREFIX + "kv_cache_usage_perc", "Fraction of KV memory in use (0..1).",
                              ["model_name"], registry=r).labels(**labels)  # fmt: skip
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests.",
                                     ["model_name"], registry=r).labels(**labels)  # fmt: skip
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", ["model_name"],
                                         registry=r).labels(**labels)  # fmt: skip
        self.success = Counter(PREFIX + "request_success", "Finished requests by reason.",
                               ["model_name", "finished_reason"], registry=r)  # fmt: skip
        self.prefix_queries = Counter(PREFIX + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      ["model_name"], registry=r).labels(**labels)  # fmt: skip
        self.prefix_hits = Counter(PREFIX + "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   ["model_name"], registry=r).labels(**labels)  # fmt: skip
        self.refused = Counter(PREFIX + "request_refused", "Requests refused at once: the line waiting for a seat was full.",
                               ["model_name"], registry=r).labels(**labels)  # fmt: skip
        self._prefix_seen = (0, 0)  # the engine's running totals at the last step (a restart resets them)
        self.step_seconds = Histogram(PREFIX + "step_seconds", "One engine step (forward + sampling).",
                                      ["model_name", "phase"], buckets=BUCKETS, registry=r)  # fmt: skip
        self.step_tokens = Counter(PREFIX + "step_tokens", "Tokens fed to the model, by step phase and kind.",
                                   ["model_name", "phase", "kind"], registry=r)  # fmt: skip
        self.model = model

    def observe_state(self, state: QueueState) -> None:
        self.running.set(state.running)
        self.waiting.set(state.waiting)
        self.kv_usage.set(state.kv_usage)
        q0, h0 = self._prefix_seen if state.prefix_queries >= self._prefix_seen[0] else (0, 0)
        self.prefix_queries.inc(state.prefix_queries - q0)
        self.prefix_hits.inc(state.prefix_hits - h0)
        self._prefix_seen = (state.prefix_queries, state.prefix_hits)

    def observe_step(self, info: StepInfo) -> None:
        self.step_seconds.labels(self.model, info.phase).observe(info.seconds)
        self.step_tokens.labels(self.model, info.phase, "prefill").inc(info.prefill_tokens)
        self.step_tokens.labels(self.model, info.phase, "decode").inc(info.decode_tokens)

    def observe_done(self, result: RequestOutput) -> None:
        self.success.labels(self.model, result.finish_reason).inc()
        m = result.metrics
        if m is None:  # cancelled before its first token
            return
        self.ttft.observe(m.ttft_s)
        self.e2e.observe(m.e2e_s)
        self.queue.observe(m.queue_s)
        for gap in m.itl_s:
            self.itl.observe(gap)
        if m.tpot_s is not None:
            self.tpot.observe(m.tpot_s)
        self.prompt_tokens.inc(m.prompt_tokens)
        self.generation_tokens.inc(m.output_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
