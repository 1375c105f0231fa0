#!/usr/bin/env bash
# Create .venv (once) and install the project with its pinned serving stack.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check -e ".[test]"
  rm -f .venv/.installed-* && touch "$stamp"
fi
# The official MiniCPM-o 4.5 code's environment for tests/official (skipped without that code).
bash scripts/setup_official.sh
