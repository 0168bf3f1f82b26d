#!/usr/bin/env bash
# The GPU checks on a lent GPU machine: a bare copy of the repository, torch installed, nothing
# of ours, maybe no pytest. Installs pytest from the wheels carried in .wheels/ when it is
# missing, then runs `pytest -m gpu tests/test_gpu.py` with this checkout importable as the
# package `shadowsync` (scripts/bare.sh). Each check prints its table of cases.
#
# Before the device call, here: pip download --only-binary :all: -d .wheels pytest
# (pure-Python wheels; .wheels is ignored by git, so name it in the call's carry).
#
#   scripts/gpu_tests.sh            # with PYTHON=python3.12 to pick another interpreter
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c "import pytest" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links "$repo/.wheels" pytest
fi
cd "$repo"
exec "$repo/scripts/bare.sh" "$py" -m pytest -m gpu -s -q -p no:cacheprovider \
  tests/test_gpu.py "$@"
