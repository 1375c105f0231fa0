#!/usr/bin/env bash
# The duplex realtime benchmark on one H200: `gpu` profile (full-random MiniCPM-o 4.5, the real
# dimensions with random weights drawn on the GPU), tritonserver from the carried Triton bundle.
#
# On the workstation, once (fills the git-ignored .devcarry/, about 45 MB: Triton bundle for
# Python 3.12, tritonclient 2.51 + its protobuf/rapidjson wheels, libcudart 12 and libb64 for
# perf_analyzer):
#   bash scripts/gpu_duplex_bench.sh prepare
# It travels to the GPU machine with the working tree, so it is kept small (under 64 MiB with the
# tree): the tritonclient wheel goes without its binaries (data/bin, ~39 MB unpacked) and
# perf_analyzer alone, xz-compressed (~5 MB).
# On the GPU machine, from a copy of the working tree with .devcarry/ beside it (each part
# starts its own server and takes under 10 minutes; COMMIT is recorded in the results; OUT
# names the folder for results and logs):
#   COMMIT=<sha> LEVEL_BUDGET_S=90 bash scripts/gpu_duplex_bench.sh bench 1,2,4,8 a
#   COMMIT=<sha> LEVEL_BUDGET_S=150 bash scripts/gpu_duplex_bench.sh bench 16,32 b
#   COMMIT=<sha> bash scripts/gpu_duplex_bench.sh pa          # optional: perf_analyzer, all models
#   PA_MODELS="code2wav duplex" ... pa                          # or some of them
#   STACK_SAMPLES=1 ... bench ...   # also a Python stack profile of every stage ($OUT/stacks)
#   BENCH_ARGS="--via gateway" ... bench ...  # perf.duplex_bench options: each level direct and
#                                   # through the WebSocket gateway, the TTFP it adds
#   MINICPMO_STAGE_CALL_METRICS=1 ... bench ...  # the orchestrator's per-stage call latency (and its
#                                   # P99 bucket) in the report's server-metrics table
#   SERVER_SETS=h100 SOAK_NAME=h100 bash scripts/gpu_duplex_bench.sh soak 24 30   # the soak (perf/soak.py)
#   MPS=off ... bench ...           # the stage processes time-slice the GPU (default auto: MPS on)
#   SERVER_SETS="max_sessions=20 ..." ... bench ...  # profile variables (`--set`) for every server; on
#                                   # an H100 (80 GB) the `gpu` profile's 32 sessions do not fit:
#                                   # SERVER_SETS=h100 (H100_SETS below) holds C <= 16 (for
#                                   # before/after comparisons; the headline runs are on H200s)
# On a machine of two H200s, the placements: (a) `bench` as above (one GPU),
#   (b) COMMIT=<sha> bash scripts/gpu_duplex_bench.sh bench-split 4,8,16,32 split
#   (c) COMMIT=<sha> bash scripts/gpu_duplex_bench.sh bench-replicas 4,8,16,32 replicas
# Each part writes $OUT/duplex_<part>.{json,md,png} (after every level, so a part cut short
# keeps what it measured) and the server log. Then, on the workstation, the current page (one
# part or several; on an H100 with SERVER_SETS=h100: --name duplex_h100, "1x H100 80 GB, ..."):
#   .venv/bin/python -m perf.bench_merge A/duplex_a.json B/duplex_b.json --name duplex_h200 \
#       --out perf/results --title "Duplex realtime benchmark, 1x H200, full-random (gpu profile)"
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.devcarry
BASE=${PORT_BASE:-8000}
# http = BASE, grpc = BASE + 1, metrics = BASE + 2 (a second replica: BASE + 10...); the ports must be free
# Dry run of the flow on a workstation: PROFILE=cpu CHECKPOINT=tiny PYTHON=.venv/bin/python
# SKIP_DEVICE_ENV=1 PORT_BASE=18300 OUT=/tmp/x bash scripts/gpu_duplex_bench.sh bench 1 a
PROFILE=${PROFILE:-gpu}
CHECKPOINT=${CHECKPOINT:-full-random}
PYTHON=${PYTHON:-python3}
# The `gpu` profile sized for an 80 GB card (24 sessions of 4096 Thinker tokens; serves C <= 16 on
# an H100, perf/results/duplex_h100.md): SERVER_SETS=h100, with hand-set shares. The memory plan's
# for 79.2 GiB (`gpu_memory_gib=79.2`, the three fractions at 0: 0.579 / 0.117 / 0.252) served the
# same levels with RTF P99 0.82 at C = 16 against 0.66 with these (perf/results/duplex_h100.md).
H100_SETS="max_sessions=24 max_context_tokens=4096 thinker_memory_fraction=0.52 talker_memory_fraction=0.12 code2wav_memory_fraction=0.28"

pack_triton() {  # pack_triton OUT.tar.xz PYVER: the tritonserver of .venv's nvidia-pytriton wheel
  # (server, backends, the Python backend stub for PYVER, vendored libraries except libpython:
  # the stub links the GPU machine's own), laid out as in the wheel so the RPATHs resolve.
  local out=$1 pyver=$2 site tmp
  site=$(.venv/bin/python -c 'import os, pytriton; print(os.path.dirname(os.path.dirname(pytriton.__file__)))')
  tmp=$(mktemp -d)
  local server="$site/pytriton/tritonserver" dest="$tmp/pytriton/tritonserver"
  mkdir -p "$dest/python_backend_stubs" "$tmp/nvidia_pytriton.libs"
  cp -r "$server/bin" "$server/backends" "$server/caches" "$dest/"
  cp -r "$server/python_backend_stubs/$pyver" "$dest/python_backend_stubs/"
  cp "$server/python_backend_stubs/$pyver/triton_python_backend_stub" "$dest/backends/python/"
  find "$site/nvidia_pytriton.libs" -maxdepth 1 -type f ! -name 'libpython*' -exec cp {} "$tmp/nvidia_pytriton.libs/" \;
  tar -C "$tmp" -cJf "$out" . && rm -rf "$tmp"
}

prepare() {
  mkdir -p "$CARRY/wheels"
  pack_triton "$CARRY/triton.tar.xz" 3.12
  .venv/bin/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$CARRY/wheels" \
    tritonclient==2.51.0 python-rapidjson==1.25 protobuf==4.25.9 nvidia-cuda-runtime-cu12==12.9.79 \
    numpy==1.26.4  # the stub's numpy paths (strings included) come back empty under numpy >= 2
  # the gateway (aiohttp) and the benchmark's WebSocket client, for `BENCH_ARGS="--via gateway"`;
  # typing_extensions stays the image's (its torch imports it)
  .venv/bin/pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$CARRY/wheels" \
    "aiohttp==$(.venv/bin/pip show aiohttp | sed -n 's/^Version: //p')" \
    "websockets==$(.venv/bin/pip show websockets | sed -n 's/^Version: //p')" \
    "soundfile==$(.venv/bin/pip show soundfile | sed -n 's/^Version: //p')" \
    "soxr==$(.venv/bin/pip show soxr | sed -n 's/^Version: //p')"  # perf/workload reads the bundled wavs
  rm -f "$CARRY"/wheels/typing_extensions-*.whl
  (cd "$CARRY" && apt-get download libb64-0d)
  .venv/bin/python - "$CARRY"/wheels/tritonclient-*.whl <<'PY'  # the wheel without its binaries
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as src:
    keep = [(i, src.read(i)) for i in src.infolist() if "/bin/" not in i.filename and ".data/scripts/" not in i.filename]
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
    for info, data in keep:
        dst.writestr(info, data)
PY
  # perf_analyzer alone, xz-compressed (~5 MB): the carried tritonclient wheel leaves its bin/ out
  xz -T2 -9 -c "$(PATH="$PWD/.venv/bin:$PATH" command -v perf_analyzer)" > "$CARRY/perf_analyzer.xz"
  du -sh "$CARRY"
}

device_env() {
  local fresh=1
  [ -x /tmp/venv/bin/python ] && fresh=0  # a second part in the same call: already unpacked
  mkdir -p /tmp/tb /tmp/b64
  if ((fresh)); then
    tar -C /tmp/tb -xJf "$CARRY/triton.tar.xz"
    # the hand-off wait the launcher gives the wheel's backend (backends/serving/stub_wait_patch.py)
    python3 -m backends.serving.stub_wait_patch /tmp/tb/pytriton/tritonserver/backends/python/libtriton_python.so
    dpkg -x "$CARRY"/libb64-0d_*.deb /tmp/b64
  fi
  # The stubs run their Python isolated (PYTHONPATH is ignored there): they see the venv whose
  # bin/ is first on PATH. This one adds tritonclient (duplex calls the stages over gRPC) to
  # the image's torch and numpy.
  ((fresh)) && python3 -m venv --system-site-packages --without-pip /tmp/venv
  local site
  site=$(/tmp/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  ((fresh)) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    $(ls "$CARRY"/wheels/*.whl | grep -v /numpy-)
  # and every path of the image's python3 (its torch may live outside what a venv inherits)
  ((fresh)) && python3 -c 'import sys; print("\n".join(p for p in sys.path if p.startswith("/") and "site" in p or "dist-packages" in p))' \
    > "$site/zz_image_python.pth"
  # Our own processes (launcher, benchmark client) take numpy 1.26, which tritonclient pins.
  ((fresh)) && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$CARRY"/wheels/numpy-*.whl
  export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 PYTHON=/tmp/venv/bin/python
  export TRITONSERVER_BIN=/tmp/tb/pytriton/tritonserver/bin/tritonserver
  export LD_LIBRARY_PATH="/tmp/b64/usr/lib/x86_64-linux-gnu:$site/nvidia/cuda_runtime/lib:${LD_LIBRARY_PATH:-}"
  if ((fresh)) && [ -f "$CARRY/perf_analyzer.xz" ]; then
    xz -dc "$CARRY/perf_analyzer.xz" > /tmp/venv/bin/perf_analyzer && chmod +x /tmp/venv/bin/perf_analyzer
  fi
  export PATH="/tmp/venv/bin:$site/bin:$PATH"  # perf_analyzer (carried on its own, see prepare)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PYTHON" -c 'import torch, numpy, tritonclient.grpc; print("server side: torch", torch.__version__, "numpy", numpy.__version__)'
}

start_server() {  # start_server NAME PORT_BASE [ENV=VALUE...]: one tritonserver, waits for readiness
  local name=$1 base=$2 sets=() var
  shift 2
  local wanted=${SERVER_SETS:-}
  [ "$wanted" = h100 ] && wanted=$H100_SETS
  for var in $wanted; do sets+=(--set "$var"); done
  ${DETACH:+setsid} env "$@" "$PYTHON" -m backends.serving.launcher --profile "$PROFILE" --mps "${MPS:-auto}" --http-port "$base" --grpc-port $((base + 1)) \
    --metrics-port $((base + 2)) --log-file "$OUT/server_$name.log" ${sets[@]+"${sets[@]}"} > "$OUT/launcher_$name.log" 2>&1 &
  SERVER_PIDS+=($!)
  local pid=$! started=$SECONDS
  until grep -qs "tritonserver ready" "$OUT/launcher_$name.log"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 60 "$OUT/server_$name.log" "$OUT/launcher_$name.log"; exit 1
    fi
    if (( SECONDS - started > 420 )); then echo "server $name not ready after 420 s"; tail -n 60 "$OUT/server_$name.log"; exit 1; fi
    sleep 2
  done
  echo "server $name ready after $(( SECONDS - started )) s"
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader || true
}

stop_servers() {
  for pid in "${SERVER_PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}
SERVER_PIDS=()
trap stop_servers EXIT

# The default title names no card: the same commands run on an H200 or an H100, and the
# report's device line (perf.duplex_bench's describe_device) names the one the run got.
bench() {  # bench LEVELS PART URLS METRICS_URLS
  local levels=${1:?levels, e.g. 1,2,4,8} part=${2:?part name, e.g. a}
  "$PYTHON" -m perf.duplex_bench --url "$3" --metrics-url "$4" \
    --profile "$PROFILE" --concurrency "$levels" --level-budget-s "${LEVEL_BUDGET_S:-0}" --name "duplex_$part" \
    --title "Duplex realtime benchmark, ${TITLE:-full-random ($PROFILE profile)}" --commit "${COMMIT:-unknown}" \
    --out "$OUT" ${BENCH_ARGS:-} || echo "benchmark exit status $? (failed turns are in the report)"
}

# Placements on a machine of two H200s; each part name gets the placement's letter.
one_server_bench() {  # everything on one GPU (profile gpu) or split over two (profile gpu-split)
  # STACK_SAMPLES=1: every stub samples its threads' Python stacks (backends/serving/stack_sampler.py)
  # into $OUT/stacks; `perf/stack_report.py $OUT/stacks` reads them.
  start_server main "$BASE" ${STACK_SAMPLES:+DUPLEX_STACK_SAMPLES_DIR=$OUT/stacks}
  touch /tmp/server_ready_marker
  local metrics="http://127.0.0.1:$((BASE + 2))/metrics" at_ready
  at_ready=$(graph_gauges "$metrics")
  bench "$1" "$2" "127.0.0.1:$((BASE + 1))" "$metrics"
  # every variant should compile at load (backends/stages/warmup.py), none inside a reply; and
  # every Code2Wav graph be captured at load: a capture or an eager call in a reply is a stall
  { echo "Triton kernels compiled while serving (count, kernel):"; compiled_since /tmp/server_ready_marker || true
    echo "Code2Wav CUDA graphs and eager CUDA calls, the stages' CUDA memory (MiB), when ready:"; echo "$at_ready"
    echo "after the benchmark:"; graph_gauges "$metrics"; } | tee "$OUT/compiled_while_serving.txt"
}

attached_bench() {  # attached_bench LEVELS PART: `bench` against the server `serve` started
  local metrics="http://127.0.0.1:$((BASE + 2))/metrics"
  bench "$1" "$2" "127.0.0.1:$((BASE + 1))" "$metrics"
  { echo "after part $2:"; graph_gauges "$metrics"; } | tee -a "$OUT/compiled_while_serving.txt"
}

attached_soak() {  # attached_soak SESSIONS MINUTES: long sessions (no barge-in, no drop) in the background
  local pid
  pid=$(pgrep -f 'tritonserver --model-repository' | head -n 1)
  setsid "$PYTHON" -m perf.soak --url "127.0.0.1:$((BASE + 1))" --metrics-url "http://127.0.0.1:$((BASE + 2))" \
    --server-pid "$pid" --sessions "$1" --minutes "$2" --turns 100000 --barge-in 0 --drop 0 --report-every 30 \
    --out "$OUT" --name "long_sessions" > "$OUT/soak_attached.log" 2>&1 < /dev/null &
  echo "soak started: $1 sessions for $2 min (log $OUT/soak_attached.log)"
}

graph_gauges() {  # graph_gauges METRICS_URL: code2wav's graph gauges (backends/models/token2wav/graphs.py)
  # and every GPU stage's allocator peak since it became ready and its reservation (MiB)
  "$PYTHON" -c 'import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1], timeout=10).read().decode().splitlines():
    if line.startswith(("minicpmo_cuda_graphs", "minicpmo_graph_eager_calls", "minicpmo_cuda_peak_allocated_mib",
                        "minicpmo_cuda_reserved_mib")): print(line)' "$1" || true
}

compiled_since() {  # compiled_since MARKER: the Triton kernel variants compiled after MARKER's mtime
  find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name '*.json' ! -name '__grp__*' -newer "$1" \
    -printf '%f\n' 2>/dev/null | sort | uniq -c
}

replicas_bench() {  # two full pipelines, one per GPU; the client splits the sessions between them
  start_server r0 "$BASE" CUDA_VISIBLE_DEVICES=0
  start_server r1 $((BASE + 10)) CUDA_VISIBLE_DEVICES=1
  bench "$1" "$2" "127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 11))" \
    "http://127.0.0.1:$((BASE + 2))/metrics,http://127.0.0.1:$((BASE + 12))/metrics"
}

perf_analyzer_all() {  # PA_MODELS: which of them (default all four)
  local models=" ${PA_MODELS:-thinker talker code2wav duplex} " secret_file
  # The stages serve only requests with the server's stage secret; the launcher names its file.
  secret_file=$(sed -n 's/^tritonserver ready: .*, stage secret file //p' "$OUT/launcher_main.log")
  for model in thinker talker code2wav; do
    [[ $models == *" $model "* ]] || continue
    "$PYTHON" -m perf.pa_run --model "$model" --checkpoint "$CHECKPOINT" --url "127.0.0.1:$((BASE + 1))" \
      --stage-secret-file "$secret_file" --sessions 4 --timeout-s 90 --out /tmp/pa > /dev/null \
      || echo "perf_analyzer $model failed"
  done
  [[ $models == *" duplex "* ]] && { "$PYTHON" -m perf.pa_run --model duplex --url "127.0.0.1:$((BASE + 1))" \
    --sequences 4 --seconds 12 --timeout-s 150 --out /tmp/pa > /dev/null || echo "perf_analyzer duplex failed"; }
  "$PYTHON" - <<'EOF' > "$OUT/pa_latency.json"
import json, pathlib
print(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path("/tmp/pa").glob("*_latency.json"))}, indent=1))
EOF
  tail -n 25 /tmp/pa/*.log > "$OUT/pa_logs.txt" 2>&1 || true
}

soak() {  # soak SESSIONS MINUTES: perf.soak against its own launcher-supervised server of this profile
  local sets=() var wanted=${SERVER_SETS:-}
  [ "$wanted" = h100 ] && wanted=$H100_SETS
  for var in $wanted; do sets+=(--set "$var"); done
  "$PYTHON" -m perf.soak --profile "$PROFILE" ${sets[@]+"${sets[@]}"} --sessions "$1" --minutes "$2" \
    --barge-in 0.4 --drop 0.3 --out "$OUT" --name "soak_${SOAK_NAME:-gpu}" --log-dir "$OUT/soak_logs" \
    || echo "soak exit status $? (its page says why)"
}

diagnose() {  # one session against a fresh server; the stubs' Python stacks after 25 s
  start_server main "$BASE"
  timeout 60 "$PYTHON" -m client.cli --url "127.0.0.1:$((BASE + 1))" --reply-units 3 --reply-tokens-per-unit 4 \
    --output /tmp/diag.wav > "$OUT/client.log" 2>&1 &
  local client=$!
  sleep 25
  pkill -USR1 -f triton_python_backend_stub || true
  sleep 2
  wait "$client" || true
  tail -n 25 "$OUT/client.log"
}

on_device() { : "${OUT:?run on the GPU machine: OUT names the output folder}"; mkdir -p "$OUT"; [ -n "${SKIP_DEVICE_ENV:-}" ] || device_env; }

case "${1:-}" in
  prepare) prepare ;;
  bench) on_device; one_server_bench "${2:-}" "${3:-}" ;;
  bench-split) on_device; PROFILE=gpu-split TITLE="2x H200, Thinker on GPU 0, Talker + Code2Wav on GPU 1" \
               one_server_bench "${2:-}" "${3:-}" ;;
  bench-replicas) on_device; TITLE="2x H200, two full replicas (one per GPU)" replicas_bench "${2:-}" "${3:-}" ;;
  soak) on_device; soak "${2:-16}" "${3:-30}" ;;
  # A server that outlives the command (setsid), for runs longer than a job's time limit:
  # `serve` starts it, `attach` benchmarks it, `soak-attach` starts a soak against it in the
  # background (its page lands in $OUT when it ends), `down` stops it. OUT must name the same
  # folder in each command (e.g. /tmp/run).
  serve) on_device; DETACH=1 start_server main "$BASE"; SERVER_PIDS=() ;;
  attach) on_device; attached_bench "${2:-}" "${3:-}" ;;
  soak-attach) on_device; attached_soak "${2:-64}" "${3:-10}" ;;
  down) pkill -INT -f backends.serving.launcher || true; sleep 15 ;;
  diag) on_device; diagnose ;;
  pa) on_device; start_server main "$BASE"; perf_analyzer_all ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
