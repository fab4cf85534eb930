#!/usr/bin/env bash
# The GPU check: the GPU-marked tests, then the benchmark on CUDA, in under 8 minutes.
#
# For a machine with an NVIDIA GPU whose python3 already has torch + transformers (no network is
# needed or used). Run from anywhere:  scripts/gpu_check.sh
# Logs and JSON reports go to $OUT if it is set (a results folder that is collected afterwards),
# else to /tmp/gpu_check_out. Every step has its own timeout, so a hang costs minutes, not the lease.
#
# What it checks (issue 2): `pytest -m gpu`, then `python -m engine bench --device cuda`, which
# also times our engine with cuda_graph=True. Targets (issue 15, engine/bench/report.py): decode with CUDA
# graphs >= 5x faster than HF eager `generate` (decode_tpot_cuda_graph_vs_hf_b1 <= 0.2); batch-1 TPOT
# with graphs <= 1.0 ms (135M shape) and <= 1.2 ms (1B shape) (decode_tpot_cuda_graph_vs_goal_b1
# <= 1); the 1B shape's 8 x 1024 prefill >= 65 % of the measured GEMM peak (..._vs_gpu_goal >= 1).
# The gpu-marked tests include the serving core's graph buckets (tests/test_engine_serving.py).
# Issue 15 adds: bf16 parity on the chef (engine/bench/bf16_parity.py), and the lab computed on the GPU
# (scripts/lab_gpu.py compute, results pickled in $OUT/lab-gpu); draw them afterwards on a CPU:
#   .venv/bin/python scripts/lab_gpu.py render --results <collected>/lab-gpu --out docs/lab-results-gpu
# The step timeouts add up to 470 s, so the whole check fits in 8 minutes even when
# every step hangs. Exit status: 0 when every step ran and passed, else the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
DEST="${OUT:-${TMPDIR:-/tmp}/gpu_check_out}"
mkdir -p "$DEST"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
summary="$DEST/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# 1. What we run on (a missing GPU ends the check here: nothing below would mean anything).
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"transformers", transformers.__version__); print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
} >"$DEST/env.txt" 2>&1
cat "$DEST/env.txt"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  note "FAIL: no CUDA device visible to $PY (see env.txt)"
  exit 1
fi

# 2. GPU tests. Only files that hold a gpu mark are collected, so app/browser test modules (which
#    need streamlit/playwright) cannot break collection on a bare GPU machine.
gpu_files=$(grep -l "mark.gpu" tests/test_*.py 2>/dev/null | tr '\n' ' ')
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  note "FAIL: pytest is not installed for $PY; GPU tests not run"
  failed=$((failed + 1))
elif [ -z "$gpu_files" ]; then
  note "FAIL: no test file has a gpu mark"
  failed=$((failed + 1))
else
  timeout 90 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider $gpu_files >"$DEST/pytest_gpu.log" 2>&1
  rc=$?
  tail -n 5 "$DEST/pytest_gpu.log"
  if [ $rc -eq 0 ]; then note "ok: pytest -m gpu ($gpu_files)"; else note "FAIL: pytest -m gpu exited $rc"; failed=$((failed + 1)); fi
fi

# 3. The benchmark on CUDA: bfloat16 (how a GPU serves) with the full plan on the 135M shape, then the
#    Llama-3.2-1B shape with a prefill of 8 x 1024 tokens (issue 15: a 512-token prefill of a 135M model
#    uses 1 % of the GPU, so its FLOP fraction means nothing) and its batch-1 decode bandwidth.
bench() {  # bench NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$PY" -m engine bench --device cuda --out "$DEST/$name.json" "$@" >"$DEST/$name.log" 2>&1
  local rc=$?
  grep -v '^\[bench\]' "$DEST/$name.log" | tail -n 20
  if [ $rc -eq 0 ]; then note "ok: bench $*"; else note "FAIL: bench $* exited $rc"; failed=$((failed + 1)); fi
}
bench bench_cuda_bf16 100 --dtype bfloat16
bench bench_cuda_1b_bf16 150 --model preset:llama-3.2-1b --dtype bfloat16 --quick --prefill-batch 8 --prefill-tokens 1024

# 4. bf16 parity on the chef: our bf16 logits' error against HF float32 beside HF bf16's (<= 1 is good).
timeout 30 "$PY" -m bench.bf16_parity --model chef --device cuda --json >"$DEST/bf16_parity_chef.json" 2>"$DEST/bf16_parity.log"
if [ $? -eq 0 ]; then note "ok: bf16 parity $(grep -o '"rms_ratio": [0-9.]*' "$DEST/bf16_parity_chef.json")"; else note "FAIL: bf16 parity (bf16_parity.log)"; failed=$((failed + 1)); fi

# 5. The lab's compute functions on the GPU, chef then the 135M shape, bf16; no new experiment starts
#    after 70 s. Only pickles here: the PNGs are drawn on a CPU machine (see the header).
timeout 100 "$PY" scripts/lab_gpu.py compute --device cuda --dtype bfloat16 --models chef preset:smollm2-135m \
  --out "$DEST/lab-gpu" --budget-s 70 >"$DEST/lab_gpu.log" 2>"$DEST/lab_gpu.err"
rc=$?
grep -E '^(ok|FAIL|skipped)' "$DEST/lab_gpu.log" | cut -c1-160
if [ $rc -eq 0 ]; then note "ok: lab computed on the GPU ($(ls "$DEST/lab-gpu" | wc -l) results)"; else note "FAIL: lab on the GPU exited $rc (lab_gpu.log, lab_gpu.err)"; failed=$((failed + 1)); fi

# 6. One line per ratio and whether its target was met, from the JSON reports.
"$PY" - "$DEST" <<'EOF' | tee -a "$summary"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("bench_*.json")):
    r = json.loads(f.read_text())
    print(f"{f.stem}: {r['machine']['gpu']}, {r['dtype']}, {r['elapsed_s']:.0f} s")
    for name, value in r["ratios"].items():
        t = r["targets"].get(name)
        print(f"  {name:46s} {value:8.3f}" + (f"  target {t['target']}: {'met' if t['met'] else 'NOT met'}" if t else ""))
EOF
note "failed steps: $failed"
exit "$failed"
