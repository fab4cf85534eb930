"""The run log: rows carry the run's measured metrics, and concurrent writers lose nothing."""

import threading
from dataclasses import dataclass

from engine.trace import Metrics, StepRecord, Trace, compute_metrics
from lab.runlog import COLUMNS, RunLog


@dataclass
class FinishedRun:
    """The fields of a GenerationResult the log reads, from a constructed trace."""

    tokens: list[list[int]]
    metrics: Metrics
    trace: Trace
    prompt_tokens: list[int]


def finished_run(ttft: float, step_s: float, steps: int, batch: int = 2) -> FinishedRun:
    trace = Trace()
    trace.steps.append(
        StepRecord(
            "prefill", 0, 0.0, ttft, ttft, batch, 10 * batch, 10 * batch, 10 * batch, 2_000_000, 1e9, 1e7
        )
    )
    trace.t_first_token = ttft
    t = ttft
    for i in range(1, steps + 1):
        trace.steps.append(
            StepRecord(
                "decode",
                i,
                t,
                t + step_s,
                step_s,
                batch,
                batch,
                batch,
                batch * (10 + i),
                2_000_000 + i * 1000,
                1e6,
                1e6,
            )
        )
        t += step_s
    trace.t_done = t
    out = [steps + 1] * batch
    return FinishedRun([[0] * n for n in out], compute_metrics(trace, out, kv_allocated=8_000_000), trace, [10] * batch)


def test_empty_log_has_the_dashboard_columns():
    df = RunLog().frame()
    assert list(df.columns) == COLUMNS
    assert len(df) == 0


def test_record_copies_the_measured_metrics():
    log = RunLog()
    run = finished_run(ttft=0.1, step_s=0.02, steps=4)
    log.record(model="chef", device="cpu", result=run, queue_wait_s=0.5)
    row = log.frame().iloc[0]
    assert row["model"] == "chef" and row["batch"] == 2
    assert row["ttft_s"] == run.metrics.ttft_s
    assert abs(row["tpot_s"] - 0.02) < 1e-12
    assert abs(row["latency_s"] - (0.5 + run.metrics.e2e_s)) < 1e-12
    assert row["prompt_tokens"] == 20 and row["output_tokens"] == 10
    assert abs(row["kv_cache_mb"] - 2.004) < 1e-9 and row["kv_allocated_mb"] == 8.0
    assert str(log.frame()["wall_time"].dtype).startswith("datetime64")


def test_concurrent_records_are_all_kept():
    log = RunLog()
    run = finished_run(ttft=0.05, step_s=0.01, steps=2)

    def writer():
        for _ in range(200):
            log.record(model="chef", device="cpu", result=run, queue_wait_s=0.0)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(log) == 800
    assert len(log.frame()) == 800
