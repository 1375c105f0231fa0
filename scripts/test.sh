#!/usr/bin/env bash
# The test suite: unit, parity and real-server tests (the fixtures start tritonserver).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q --durations=25 "$@"  # the slowest tests, to keep the suite in its budget
