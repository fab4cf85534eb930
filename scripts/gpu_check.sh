#!/usr/bin/env bash
# The GPU check: the GPU-marked tests, then the benchmark on CUDA, in under 8 minutes.
#
# For a machine with an NVIDIA GPU whose python3 already has torch + transformers (no network is
# needed or used). Run from anywhere:  scripts/gpu_check.sh
# Logs and JSON reports go to $OUT if it is set (a results folder that is collected afterwards),
# else to /tmp/gpu_check_out. Every step has its own timeout, so a hang costs minutes, not the lease.
#
# What it checks (issue 2): `pytest -m gpu`, then `python -m engine bench --device cuda`, which
# also times our engine with cuda_graph=True. Target there: decode with CUDA graphs >= 3x faster
# than HF eager `generate` (ratio decode_tpot_cuda_graph_vs_hf_b1 <= 0.333).
# Exit status: 0 when every step ran and passed, else the number of failed steps.
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
  timeout 150 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider $gpu_files >"$DEST/pytest_gpu.log" 2>&1
  rc=$?
  tail -n 5 "$DEST/pytest_gpu.log"
  if [ $rc -eq 0 ]; then note "ok: pytest -m gpu ($gpu_files)"; else note "FAIL: pytest -m gpu exited $rc"; failed=$((failed + 1)); fi
fi

# 3. The benchmark on CUDA: bfloat16 (how a GPU serves) with the full plan, then float32 quick.
bench() {  # bench NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$PY" -m engine bench --device cuda --out "$DEST/$name.json" "$@" >"$DEST/$name.log" 2>&1
  local rc=$?
  grep -v '^\[bench\]' "$DEST/$name.log" | tail -n 20
  if [ $rc -eq 0 ]; then note "ok: bench $*"; else note "FAIL: bench $* exited $rc"; failed=$((failed + 1)); fi
}
bench bench_cuda_bf16 170 --dtype bfloat16
bench bench_cuda_fp32_quick 90 --dtype float32 --quick

# 4. One line per ratio and whether its target was met, from the JSON reports.
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
