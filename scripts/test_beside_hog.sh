#!/usr/bin/env bash
# Runs the test suite beside a busy neighbour: a Python busy loop pinned to one core for the whole run.
# A developer's machine is often busy (a browser, a build, another app); a test that passes only on a
# quiet machine trains people to ignore failures, so the suite must pass here too.
#
#   bash scripts/test_beside_hog.sh                                # the whole suite, as scripts/test.sh
#   bash scripts/test_beside_hog.sh -n 0 tests/test_lab_serving.py # some files, one process
#   HOG_CORE=1 HOG_TEST="" bash scripts/test_beside_hog.sh ...     # another core; pytest alone (no setup)
#
# HOG_CORE: the core the loop is pinned to (default 0; unpinned where taskset is missing).
# HOG_TEST: the command the arguments are given to (default `bash scripts/test.sh`, which sets up the
# machine, lints and runs pytest); set it empty to run the venv's pytest directly on a set-up checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

CORE="${HOG_CORE:-0}"
if command -v taskset >/dev/null; then
  taskset -c "$CORE" python3 -c "while True: pass" &
  WHERE="pinned to core $CORE"
else
  python3 -c "while True: pass" &
  WHERE="unpinned (no taskset)"
fi
HOG=$!
trap 'kill "$HOG" 2>/dev/null || true' EXIT
echo "scripts/test_beside_hog.sh: a busy loop (pid $HOG) $WHERE, of $(nproc) cores" >&2

START=$(date +%s)
set +e
if [ -z "${HOG_TEST-bash scripts/test.sh}" ]; then
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false .venv/bin/python -m pytest -q -rs "$@"
else
  # shellcheck disable=SC2086  # HOG_TEST is a command line
  ${HOG_TEST-bash scripts/test.sh} "$@"
fi
RC=$?
set -e
echo "scripts/test_beside_hog.sh: exit $RC after $(($(date +%s) - START)) s beside the busy loop;" \
  "1-minute load average now $(cut -d' ' -f1 /proc/loadavg)" >&2
exit $RC
