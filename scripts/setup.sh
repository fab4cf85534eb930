#!/usr/bin/env bash
# Sets up .venv for the app (`bash scripts/setup.sh`) or for its tests (`bash scripts/setup.sh dev`).
# Idempotent: a second run reuses .venv. Used by scripts/run.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned exactly in pyproject.toml, but the pin does not choose CPU or CUDA:
# scripts/torch_choice.sh says which build this machine wants (cpu: no NVIDIA GPU on Linux x86-64,
# where the public index would serve the CUDA wheel). Only when torch is missing.
if ! .venv/bin/python -c "import torch" 2>/dev/null && [ "$(bash scripts/torch_choice.sh)" = cpu ]; then
  TORCH_PIN=$(sed -n 's/^ *"\(torch==[^"]*\)",.*/\1/p' pyproject.toml)
  # --retries 0: where that index cannot be reached (an offline mirror), pip falls back at once to
  # the other sources it is configured with instead of retrying each package for minutes.
  .venv/bin/python -m pip install -q "$TORCH_PIN" --index-url https://download.pytorch.org/whl/cpu \
    --retries 0 --timeout 10
fi
.venv/bin/python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}"
