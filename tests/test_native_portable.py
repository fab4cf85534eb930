"""The native step built for other CPUs and by other compilers gives this machine's numbers.

This machine's native step (x86-64) makes the cases (tests/native_cases.py: the float32 and int8
products, attention, and whole passes of tiny Llama float32 and int8 and GPT-2 models, a prompt
pass then a decode step on two threads). A C driver (tests/native_driver.c) built from the same
source runs them: here with gcc, for x86-64-v2 (no AVX), on the plain C path, and with clang; for
aarch64 with Debian's cross gcc (plain NEON, and the dot-product instructions) and with clang,
under qemu-user. Each result must equal this machine's within the tolerance native_cases.py states.
Where a compiler or qemu is missing, its test is skipped with one line (scripts/test.sh installs them).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from native_cases import (
    attention,
    attention_case,
    compare,
    model_files,
    product_case,
    run_driver,
    step_case,
    write_cases,
)
from test_compiled import PROMPTS

from engine import Engine
from engine.native_build import Build, compile_c, library

HERE = Path(__file__).parent
DRIVER = HERE / "native_driver.c"
ENGINE = HERE.parent / "engine"
pytestmark = pytest.mark.skipif(isinstance(library(), str), reason="the native step could not be built here")
CROSS = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"


@pytest.fixture(scope="module")
def cases(tmp_path_factory, tiny_llama, tiny_gpt2):
    root = tmp_path_factory.mktemp("native_cases")
    g = torch.Generator().manual_seed(0)
    made = []
    # float32: the streaming GEMV (1-4 rows), 6-row blocks with a tail of columns, and a weight whose rows
    # lie 64 KB apart (copied panel by panel)
    for M, K, N in [(1, 64, 200), (3, 64, 200), (7, 96, 130), (13, 40, 16400)]:
        x, w = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)  # (M, K), (K, N)
        made.append(product_case(root, f"f32_{M}x{K}x{N}", x, w))
    # int8: K whole block pairs (VNNI's 64-byte dots), an odd block left (sdot's 32 bytes), a short last
    # block (the plain loop), one block; an outlier input in every row, as real activations have. The
    # LM head's input is rounded twice (refine): its pairs of rounded rows cross the 4-row groups at 3 and 5 rows
    for M, K, N, refine in [(1, 128, 37, 0), (5, 96, 41, 0), (3, 100, 20, 0), (6, 32, 8, 0), (5, 96, 41, 1),
                            (3, 100, 20, 1), (1, 128, 37, 1)]:  # fmt: skip
        x = torch.randn(M, K, generator=g)
        x[:, K // 3] *= 40.0
        q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)  # (N, K)
        scale = (torch.rand(N, -(-K // 32), generator=g) / 64).half()  # (N, blocks)
        made.append(product_case(root, f"int8_{M}x{K}x{N}{'_refine' if refine else ''}", x, q, scale, bool(refine)))
    # attention: a decode row; a prompt chunk after 11 slots; a first chunk with a head size not a multiple of 16
    for R, p0, G, D in [(1, 22, 2, 32), (5, 11, 2, 16), (3, 0, 3, 20)]:
        q, keys, values = torch.randn(R, G, D, generator=g), torch.randn(p0 + R, D, generator=g), torch.randn(p0 + R, D, generator=g)
        made.append(attention_case(root, f"attention_{R}_{p0}_{G}_{D}", q, keys, values, p0))
    prompt, decode = ({"tok": PROMPTS[2][:11] + PROMPTS[0][:6], "pos": list(range(11)) + list(range(6)),
                       "seat": [0] * 11 + [1] * 6, "out": [10, 16]},
                      {"tok": [5, 9], "pos": [11, 6], "seat": [0, 1], "out": [0, 1]})  # fmt: skip
    for model, quant in [(tiny_llama, None), (tiny_llama, "int8"), (tiny_gpt2, None)]:
        eng = Engine.load(str(model.path), max_seqs=2, quant=quant)
        assert eng.native.ready, eng.native.problem
        pool = eng.serving.pool
        for t in pool.k_layer + pool.v_layer:  # slots no pass writes are compared too: make them zeros
            t.zero_()
        name = model_files(root, f"{model.family}_{quant or 'f32'}", eng.native)
        made.append(step_case(root, f"{name}_prompt", name, eng.native, pool, prompt, threads=1))
        made.append(step_case(root, f"{name}_decode", name, eng.native, pool, decode, threads=2))
    write_cases(root, made)
    return root, made


def build_driver(out: Path, build: Build, *extra: str) -> Path:
    error = compile_c(build.compiler(), [*build.cflags(), "-I", str(ENGINE), *extra], [DRIVER], out)
    assert error is None, f"building the driver with {build} failed: {error}"
    return out


def test_the_cases_this_machine_made_hold_the_math(cases):
    """The expected numbers are right: this machine's attention against softmax(q k^T / sqrt(D)) v."""
    g = torch.Generator().manual_seed(1)
    R, p0, G, D = 5, 11, 2, 16
    q, keys, values = torch.randn(R, G, D, generator=g), torch.randn(p0 + R, D, generator=g), torch.randn(p0 + R, D, generator=g)
    scores = torch.einsum("rgd,sd->rgs", q, keys) / D**0.5  # (R, G, S)
    causal = torch.arange(p0 + R)[None, :] <= (p0 + torch.arange(R))[:, None]  # (R, S)
    want = torch.einsum("rgs,sd->rgd", scores.masked_fill(~causal[:, None], float("-inf")).softmax(-1), values)
    torch.testing.assert_close(attention(q, keys, values, p0), want, atol=1e-5, rtol=0)
    root, made = cases
    assert len(made) == 4 + 7 + 3 + 6 and (root / "cases.txt").read_text().count("\n") == len(made)


@pytest.mark.parametrize("build", [Build(cc="gcc"), Build(cc="gcc", portable=True), Build(cc="gcc", arch="x86-64-v2")],
                         ids=["native", "portable-c", "x86-64-v2"])  # fmt: skip
def test_the_driver_built_here_gives_this_machines_numbers(cases, tmp_path, build):
    if build.compiler() is None:
        pytest.skip("gcc is not installed")
    root, made = cases
    out = run_driver([str(build_driver(tmp_path / "driver", build))], root)
    isa = "portable C" if build.portable else "SSE" if build.arch == "x86-64-v2" else library().twopot_isa().decode()
    assert out == f"{len(made)} cases on {isa}"  # the native build: the same instructions as the engine's
    compare(root, made)


def test_clang_builds_the_step_and_the_driver(cases, tmp_path):
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (scripts/test.sh installs it)")
    root, made = cases
    lib = library(Build(cc="clang"))  # the step as the engine loads it, built by clang
    assert not isinstance(lib, str), lib
    out = run_driver([str(build_driver(tmp_path / "driver", Build(cc="clang")))], root)
    assert out.startswith(f"{len(made)} cases on ")
    compare(root, made)


@pytest.mark.parametrize("cc, arch, isa", [(CROSS, "armv8-a", "NEON"), (CROSS, "armv8.2-a+dotprod", "NEON dotprod"),
                                           ("clang", "armv8.2-a+dotprod", "NEON dotprod")])  # fmt: skip
def test_the_aarch64_build_gives_this_machines_numbers_under_qemu(cases, tmp_path, cc, arch, isa):
    """Debian's cross gcc (and clang, with its libraries and linker) builds the step for 64-bit ARM;
    qemu-user runs it on this machine."""
    if shutil.which(CROSS) is None or shutil.which(QEMU) is None or shutil.which(cc) is None:
        pytest.skip(f"{CROSS}, {cc} and {QEMU} are not all installed (scripts/test.sh installs them)")
    root, made = cases
    target = ["--target=aarch64-linux-gnu"] if cc == "clang" else []
    driver = build_driver(tmp_path / "driver", Build(cc=cc, arch=arch), *target, "-static")
    out = run_driver([QEMU, str(driver)], root)
    assert out == f"{len(made)} cases on {isa}"
    compare(root, made)
