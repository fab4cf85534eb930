#!/usr/bin/env bash
# Sets up .venv for the app (`bash scripts/setup.sh`) or for its tests (`bash scripts/setup.sh dev`).
# Idempotent: a second run reuses .venv. Used by scripts/run.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned exactly in pyproject.toml, but the pin does not choose CPU or CUDA: on Linux x86-64
# the public index serves the CUDA wheel and its nvidia-* packages (several GB). Without an NVIDIA
# GPU, take the same version from PyTorch's CPU wheel index first (only when torch is missing).
# macOS and Linux on ARM get a CPU build from the public index anyway.
if ! .venv/bin/python -c "import torch" 2>/dev/null && [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] \
   && ! command -v nvidia-smi >/dev/null; then
  TORCH_PIN=$(sed -n 's/^ *"\(torch==[^"]*\)",.*/\1/p' pyproject.toml)
  # --retries 0: where that index cannot be reached (an offline mirror), pip falls back at once to
  # the other sources it is configured with instead of retrying each package for minutes.
  .venv/bin/python -m pip install -q "$TORCH_PIN" --index-url https://download.pytorch.org/whl/cpu \
    --retries 0 --timeout 10
fi
.venv/bin/python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
