#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh Debian machine, then lints and runs it.
# Idempotent: a second run reuses .venv and the installed browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium drives the browser tests and the PNG export (Playwright cannot download its
# own browser here); the emoji font makes the kitchen's icons render in screenshots. Debian's
# Prometheus scrapes the class kitchen in tests/test_prometheus.py. The aarch64 cross gcc and
# qemu-user build the native step for 64-bit ARM and run it here, and clang builds it a second
# way (tests/test_native_portable.py).
CROSS=""; [ "$(uname -m)" = x86_64 ] && CROSS="gcc-aarch64-linux-gnu qemu-user"
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/prometheus ] || ! command -v clang >/dev/null \
   || { [ -n "$CROSS" ] && ! command -v aarch64-linux-gnu-gcc >/dev/null; } \
   || { [ -n "$CROSS" ] && ! command -v qemu-aarch64 >/dev/null; }; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086  # CROSS is a list of packages
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-noto-color-emoji prometheus \
    gcc clang $CROSS >/dev/null
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

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
# --durations: the slowest tests are named in every run, so the suite's time budget can be kept.
# -n 2 --dist loadfile (pytest-xdist): two worker processes, each test file whole on one of them, so
# a file's module fixtures (an app server, a browser, compiled engines) start once. Much of the
# suite waits on browsers, servers and child processes, and a second worker fills those waits.
# `scripts/test.sh -n 0` runs it in one process.
.venv/bin/python -m pytest -q -rs --durations=25 -n 2 --dist loadfile "$@"
