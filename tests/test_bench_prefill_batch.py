"""The bench's prefill of B prompts (`--prefill-batch`): the shape a GPU needs to be compute-bound
(Llama-3.2-1B, 8 x 1024). Checked on a tiny model: the pass, its FLOPs and its kernel
ceiling all cover B x P tokens. No timing is asserted."""

from dataclasses import replace

import pytest

from engine.bench.bench import run_bench
from engine.bench.cli import main
from engine.bench.plan import BenchPlan
from engine.bench.roofline import measure_roofline

TINY = BenchPlan(prefill_tokens=24, decode_prompt_tokens=5, decode_tokens=4, big_batch=3, big_batch_prompt_tokens=4,
            repeats=1, warmup=1)  # fmt: skip


def test_prefill_batch_covers_every_prompt(tiny_llama_tied):
    roof = measure_roofline("cpu", "float32", quick=True, buffer_bytes=8 * 2**20, gemm_sizes=(128,))
    one = run_bench(str(tiny_llama_tied.path), plan=TINY, roofline=roof)
    three = run_bench(str(tiny_llama_tied.path), plan=replace(TINY, prefill_batch=3), roofline=roof)
    assert one["prefill"]["prompt_batch"] == 1 and three["prefill"]["prompt_batch"] == 3
    assert three["prefill"]["ours"]["prefill_flops"] == pytest.approx(3 * one["prefill"]["ours"]["prefill_flops"])
    assert three["kernel_ceilings"]["prefill_batch"] == 3


def test_bad_prefill_batch_is_one_line(capsys):
    assert main(["--prefill-batch", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "prefill batch must be at least 1" in err and err.count("\n") == 1
