#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh Debian machine, then lints and runs it.
# Idempotent: a second run reuses .venv and the installed browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium drives the browser tests and the PNG export (Playwright cannot download its
# own browser here); the emoji font makes the kitchen's icons render in screenshots.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-noto-color-emoji >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned exactly in pyproject.toml: a looser pin drags in a multi-GB CUDA build.
.venv/bin/python -m pip install -q -e ".[dev]"

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -rs "$@"
