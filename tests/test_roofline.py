"""The roofline is measured, positive, and its derived numbers follow from the measured ones.

No speed assertions: machines are shared and noisy. Small buffers/GEMMs keep this under a second.
"""

import pytest
import torch

from engine.bench.roofline import Roofline, measure_roofline
from engine.errors import EngineError

SMALL = {"buffer_bytes": 16 * 2**20, "gemm_sizes": (128, 256)}


@pytest.fixture(scope="module")
def roof() -> Roofline:
    return measure_roofline("cpu", "float32", quick=True, **SMALL)


def test_roofs_are_measured_and_positive(roof):
    assert roof.bandwidth_bytes_per_s > 0
    assert roof.flops_per_s > 0
    assert roof.device == "cpu" and roof.dtype == "float32"
    bw = roof.details["bandwidth"]
    assert bw["buffer_bytes"] == SMALL["buffer_bytes"]
    assert len(bw["times_s"]) == roof.details["repeats"]
    assert all(t > 0 for t in bw["times_s"])


def test_roofs_follow_from_their_own_timings(roof):
    bw = roof.details["bandwidth"]
    assert roof.bandwidth_bytes_per_s == pytest.approx(bw["bytes_per_call"] / min(bw["times_s"]))  # the fastest repeat
    assert bw["bytes_per_call"] % bw["buffer_bytes"] == 0  # whole reads of the buffer
    assert bw["best_s"] == min(bw["times_s"]) <= bw["median_s"]
    sizes = roof.details["gemm"]["sizes"]
    assert set(sizes) == {"128", "256"}
    for n, r in sizes.items():
        assert r["flops_per_s"] == pytest.approx(2 * int(n) ** 3 / min(r["times_s"]))
    assert roof.flops_per_s == max(r["flops_per_s"] for r in sizes.values())
    assert roof.details["threads"] == torch.get_num_threads()


def test_the_dram_roof_is_the_faster_of_one_thread_and_all_threads():
    """Beside a neighbour on one core an even split waits for its slowest thread; one thread alone
    does not, so the roof is the faster reading, and the engine's thread count is left as it was."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        roof = measure_roofline("cpu", "float32", quick=True, caches=False, **SMALL)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    bw = roof.details["bandwidth"]
    assert set(bw["by_threads"]) == {"1", "2"} and bw["method"].startswith("the C probe")  # the loop the caches are read by
    speeds = {t: r["bytes_per_s"] for t, r in bw["by_threads"].items()}
    for t, r in bw["by_threads"].items():
        assert speeds[t] == pytest.approx(r["bytes_per_call"] / min(r["times_s"]))
    assert roof.bandwidth_bytes_per_s == max(speeds.values()) == speeds[str(bw["threads"])]


def test_ridge_and_attainable_bend_where_the_roofs_meet(roof):
    assert roof.ridge == pytest.approx(roof.flops_per_s / roof.bandwidth_bytes_per_s)
    assert roof.attainable(0.0) == 0.0
    assert roof.attainable(roof.ridge / 2) == pytest.approx(roof.flops_per_s / 2)
    assert roof.attainable(roof.ridge) == pytest.approx(roof.flops_per_s)
    assert roof.attainable(roof.ridge * 100) == roof.flops_per_s
    assert roof.to_dict()["ridge_flop_per_byte"] == pytest.approx(roof.ridge)


def test_worked_example_from_the_docstring():
    roof = Roofline(bandwidth_bytes_per_s=29e9, flops_per_s=130e9, device="cpu", dtype="float32")
    assert roof.ridge == pytest.approx(4.48, abs=0.01)
    assert roof.attainable(0.5) == pytest.approx(14.5e9)


def test_bfloat16_gemm_is_measured_in_that_dtype():
    roof = measure_roofline("cpu", "bfloat16", quick=True, buffer_bytes=2**20, gemm_sizes=(64,))
    assert roof.dtype == "bfloat16" and roof.flops_per_s > 0


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"device": "tpu"}, "device 'tpu'"),
        ({"dtype": "float8"}, "invalid dtype 'float8'"),
        ({"buffer_bytes": 0}, "bandwidth buffer must be positive"),
        ({"gemm_sizes": ()}, "GEMM sizes must be positive"),
    ],
)
def test_bad_input_is_one_clear_line(kwargs, words):
    with pytest.raises(EngineError) as err:
        measure_roofline(**({"quick": True} | kwargs))
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(EngineError, match="no CUDA GPU is available"):
        measure_roofline("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_roofline_is_measured():
    roof = measure_roofline("cuda", "bfloat16", quick=True, buffer_bytes=256 * 2**20, gemm_sizes=(1024,))
    assert roof.device.startswith("cuda") and roof.bandwidth_bytes_per_s > 0 and roof.flops_per_s > 0
