#!/usr/bin/env bash
# The duplex realtime benchmark on one H200: `gpu` profile (full-random MiniCPM-o 4.5, the real
# dimensions with random weights drawn on the GPU), tritonserver from the carried Triton bundle.
#
# Here, once (fills the git-ignored .devcarry/, about 45 MB: Triton bundle for Python 3.12,
# tritonclient 2.51 + its protobuf/rapidjson wheels, libcudart 12 and libb64 for perf_analyzer):
#   bash scripts/gpu_duplex_bench.sh prepare
# On the device, through the `run` tool with carry [".devcarry"] (each part starts its own
# server and stays inside one 10-minute call; COMMIT is recorded in the results):
#   COMMIT=<sha> LEVEL_BUDGET_S=90 bash scripts/gpu_duplex_bench.sh bench 1,2,4,8 a
#   COMMIT=<sha> LEVEL_BUDGET_S=150 bash scripts/gpu_duplex_bench.sh bench 16,32 b
#   COMMIT=<sha> bash scripts/gpu_duplex_bench.sh pa          # optional: perf_analyzer, all models
# Each part writes $OUT/duplex_h200_<part>.{json,md,png} (after every level, so a part cut
# short keeps what it measured) and the server log. Then, here:
#   .venv/bin/python -m perf.bench_merge A/duplex_h200_a.json B/duplex_h200_b.json \
#       --name duplex_h200 --out perf/results --title "Duplex realtime benchmark, 1x H200, full-random"
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.devcarry
BASE=${PORT_BASE:-8000}
PORTS=("$BASE" $((BASE + 1)) $((BASE + 2)))  # http, grpc, metrics (the device machine is ours alone)
# Dry run of the flow on a workstation: PROFILE=cpu CHECKPOINT=tiny PYTHON=.venv/bin/python
# SKIP_DEVICE_ENV=1 PORT_BASE=18300 OUT=/tmp/x bash scripts/gpu_duplex_bench.sh bench 1 a
PROFILE=${PROFILE:-gpu}
CHECKPOINT=${CHECKPOINT:-full-random}
PYTHON=${PYTHON:-python3}

prepare() {
  mkdir -p "$CARRY/wheels"
  PATH="$PWD/.venv/bin:$PATH" bash ../shared/tools/triton-bundle "$CARRY/triton.tar.xz" 3.12
  .venv/bin/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$CARRY/wheels" \
    tritonclient==2.51.0 python-rapidjson==1.25 protobuf==4.25.9 nvidia-cuda-runtime-cu12==12.9.79 \
    numpy==1.26.4  # the stub's numpy paths (strings included) come back empty under numpy >= 2
  (cd "$CARRY" && apt-get download libb64-0d)
  du -sh "$CARRY"
}

device_env() {
  mkdir -p /tmp/tb /tmp/b64
  tar -C /tmp/tb -xJf "$CARRY/triton.tar.xz"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$CARRY"/wheels/*.whl
  dpkg -x "$CARRY"/libb64-0d_*.deb /tmp/b64
  # The carried wheels first: tritonclient 2.51 with the protobuf it was generated for. The
  # image's torch, numpy and tokenizers serve the stage models.
  export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
  export TRITONSERVER_BIN=/tmp/tb/pytriton/tritonserver/bin/tritonserver
  export LD_LIBRARY_PATH="/tmp/b64/usr/lib/x86_64-linux-gnu:/tmp/site/nvidia/cuda_runtime/lib:${LD_LIBRARY_PATH:-}"
  export PATH="/tmp/site/bin:$PATH"  # perf_analyzer from the tritonclient wheel
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, numpy, tritonclient.grpc; print("torch", torch.__version__, "numpy", numpy.__version__)'
}

start_server() {
  "$PYTHON" -m backends.serving.launcher --profile "$PROFILE" --http-port "${PORTS[0]}" --grpc-port "${PORTS[1]}" \
    --metrics-port "${PORTS[2]}" --log-file "$OUT/server.log" > "$OUT/launcher.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill -INT $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null || true' EXIT
  local started=$SECONDS
  until grep -q "tritonserver ready" "$OUT/launcher.log"; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      tail -n 60 "$OUT/server.log" "$OUT/launcher.log"; exit 1
    fi
    if (( SECONDS - started > 420 )); then echo "server not ready after 420 s"; tail -n 60 "$OUT/server.log"; exit 1; fi
    sleep 2
  done
  echo "server ready after $(( SECONDS - started )) s"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader || true
}

bench() {
  local levels=${1:?levels, e.g. 1,2,4,8} part=${2:?part name, e.g. a}
  "$PYTHON" -m perf.duplex_bench --url "127.0.0.1:${PORTS[1]}" --metrics-url "http://127.0.0.1:${PORTS[2]}/metrics" \
    --profile "$PROFILE" --concurrency "$levels" --level-budget-s "${LEVEL_BUDGET_S:-0}" --name "duplex_h200_$part" \
    --title "Duplex realtime benchmark, 1x H200, full-random ($PROFILE profile)" --commit "${COMMIT:-unknown}" \
    --out "$OUT" || echo "benchmark exit status $? (failed turns are in the report)"
}

perf_analyzer_all() {
  for model in thinker talker code2wav; do
    "$PYTHON" -m perf.pa_run --model "$model" --checkpoint "$CHECKPOINT" --url "127.0.0.1:${PORTS[1]}" \
      --sessions 4 --timeout-s 90 --out /tmp/pa > /dev/null || echo "perf_analyzer $model failed"
  done
  "$PYTHON" -m perf.pa_run --model duplex --url "127.0.0.1:${PORTS[1]}" --sequences 4 --seconds 12 \
    --timeout-s 150 --out /tmp/pa > /dev/null || echo "perf_analyzer duplex failed"
  "$PYTHON" - <<'EOF' > "$OUT/pa_latency.json"
import json, pathlib
print(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path("/tmp/pa").glob("*_latency.json"))}, indent=1))
EOF
  tail -n 25 /tmp/pa/*.log > "$OUT/pa_logs.txt" 2>&1 || true
}

case "${1:-}" in
  prepare) prepare ;;
  bench) : "${OUT:?run on the device: OUT is its output folder}"; [ -n "${SKIP_DEVICE_ENV:-}" ] || device_env
         start_server; bench "${2:-}" "${3:-}" ;;
  pa) : "${OUT:?run on the device: OUT is its output folder}"; [ -n "${SKIP_DEVICE_ENV:-}" ] || device_env
      start_server; perf_analyzer_all ;;
  *) sed -n 2,17p "$0"; exit 2 ;;
esac
