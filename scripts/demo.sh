#!/usr/bin/env bash
# Main job: install, generate the tiny model, start the server, hold a duplex conversation
# from the bundled wav, write reply.wav, print latencies, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/minicpmo-demo "$@"
