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

bash scripts/setup.sh dev

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
# --durations: the slowest tests are named in every run, so the suite's time budget can be kept.
# -n 2 --dist loadfile (pytest-xdist): two worker processes, each test file whole on one of them, so
# a file's module fixtures (an app server, a browser, compiled engines) start once. Much of the
# suite waits on browsers, servers and child processes, and a second worker fills those waits.
# `scripts/test.sh -n 0` runs it in one process.
.venv/bin/python -m pytest -q -rs --durations=25 -n 2 --dist loadfile "$@"
