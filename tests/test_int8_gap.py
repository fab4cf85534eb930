"""The int8 gap bench (engine/bench/int8_gap.py): the engine's int8 kernel against its own rounding
rule on the same activations, and each way of running the rule against float32. The kernel's sums
are exact integers times float32 scales; the rule's are float32 sums of the rounded values, so on
every product they may differ only by float32 rounding (bound: 1e-5 of the product's range)."""

import pytest
import torch

from engine import native_build
from engine.bench.int8_gap import gap
from engine.fidelity import scored_rows

pytestmark = pytest.mark.skipif(not native_build.ready(), reason="the engine's int8 kernel is not built here")


def test_the_kernel_is_its_rule_on_every_product_and_every_run_is_scored(tiny_llama):
    gen = torch.Generator().manual_seed(0)
    windows = [torch.randint(0, 320, (16,), generator=gen).tolist() for _ in range(2)]
    report = gap(str(tiny_llama.path), windows, lambda _: None)
    assert set(report["products"]) == {"qkv", "out", "up", "down", "lm_head"}
    for kind, row in report["products"].items():
        assert row["calls"] >= 2 and row["max_rel"] < 1e-5, kind
    positions = 2 * len(scored_rows(16))
    assert len(report["against_float32"]) == 10 and len(report["against_native_step"]) == 4
    for row in report["against_float32"] + report["against_native_step"]:
        assert row["positions"] == positions and 0 <= row["kl_mean"] < 0.05 and 0.5 <= row["top1"] <= 1
    assert all(len(kls) == 2 for kls in report["kl_mean_per_window"].values())
