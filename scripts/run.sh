#!/usr/bin/env bash
# The README's run command: set up .venv (torch's CPU build where there is no NVIDIA GPU), then
# open the app. Arguments go to the launcher (`bash scripts/run.sh --presenter --server.port 8600`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/two-pot-kitchen "$@"
