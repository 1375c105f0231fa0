#!/usr/bin/env bash
# On the GPU machine, one device call: is the Thinker's host work per step (in-step drain of new
# appends, twenty-fifth session; compact host rows, twenty-sixth) worth its keep at 16 sessions?
# Here first: `bash scripts/gpu_duplex_bench.sh prepare` (fills .devcarry); carry [".devcarry"].
#
#   bash scripts/gpu_thinker_host_ab.sh checks new_a base_a    # GPU tests, in-process A/B, two starts
#   bash scripts/gpu_thinker_host_ab.sh starts base_b new_b    # more served starts, another call
#   bash scripts/gpu_thinker_host_ab.sh encoder                # the encoder's key buckets in-process
#   BASE_SWITCHES=MINICPMO_ENCODER_KEY_BUCKETS=0 bash scripts/gpu_thinker_host_ab.sh starts new base
#   SERVER_SETS=h100 ... starts new base   # on an H100: the served stack sized for 80 GB (A/B only)
#
# "checks": the GPU tests of both changes and the host draws' tests on this machine's numpy,
# the policy draw's host cost (perf/bench_policy_draw.py: one row, 16 rows drawn together), then
# perf/bench_thinker_engine.py at C = 16 alternating
# (in flight, compact rows) = (on, auto), (off, off), (on, off), (off, auto) in one process.
# Each further argument is one served C = 16 start (30-s level, stage-call metrics) named
# s26_<arm>: arms named base* run with $BASE_SWITCHES (default: both off, MINICPMO_IN_STEP_DRAIN=0
# MINICPMO_COMPACT_HOST_ROWS=0), the others run the defaults.
# "encoder" (twenty-ninth session): the graphed audio encoder's GPU tests, its pass with keys
# bucketed vs the whole 1500-frame table, q/k/v packed vs not, split-key attention kernel
# (perf/bench_audio_encoder.py), then the Thinker engine at
# C = 1 and 16 with encoder keys (bucketed, split, bucketed, split) in one process, with the steps' kinds. Only each start's JSON and Markdown
# stay in $OUT (the device tool returns 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
phase=$1
shift
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-perf/out}"
mkdir -p "$out"
if [ "$phase" = checks ]; then
  nvidia-smi -L
  python3 -m pytest -q -p no:cacheprovider tests/runner_gpu/test_gpu_compact_rows.py \
    tests/runner_gpu/test_gpu_thinker_in_flight.py tests/runner_gpu/test_gpu_hook_candidates.py \
    tests/runner/test_draws_together.py tests/thinker/test_policy_rows.py 2>&1 | tail -4
  python3 perf/bench_policy_draw.py 2>&1 | tail -13 | tee "$out/policy_draw_host.txt"
  timeout 200 python3 perf/bench_thinker_engine.py --concurrency 16 --seconds 8 \
    --in-flight on,off,on,off --compact-rows auto,off,off,auto 2>&1 | grep -E '^\| (16|C) ' \
    | tee "$out/thinker_ab16.txt"
elif [ "$phase" = encoder ]; then
  nvidia-smi -L
  python3 -m pytest -q -p no:cacheprovider tests/audio/test_encoder_graphs.py \
    tests/audio/test_batched_encoder.py tests/runner_gpu/test_gpu_thinker_in_flight.py \
    tests/models/test_whisper_encoder.py tests/models/test_chunk_attention_kernel.py \
    tests/models/token2wav/test_token2wav_graphs.py 2>&1 | tail -4
  python3 perf/bench_audio_encoder.py 2>&1 | tee "$out/encoder_keys.txt"
  timeout 360 python3 perf/bench_thinker_engine.py --concurrency 1,16 --seconds 6 \
    --encoder-keys bucketed,split,bucketed,split 2>&1 | grep -E '^(\| (1|16|C) |  C = )' \
    | tee "$out/thinker_keys.txt"
elif [ "$phase" != starts ]; then
  echo "usage: $0 checks|encoder|starts [arm ...]" >&2
  exit 2
fi
for arm in "$@"; do
  switches=()
  # shellcheck disable=SC2206 # a list of NAME=value words
  case $arm in base*) switches=(${BASE_SWITCHES:-MINICPMO_IN_STEP_DRAIN=0 MINICPMO_COMPACT_HOST_ROWS=0}) ;; esac
  echo "=== arm $arm (${switches[*]:-defaults}) $(date +%T)"
  env "${switches[@]}" COMMIT="${COMMIT:-wip}-$arm" MINICPMO_STAGE_CALL_METRICS=1 LEVEL_BUDGET_S=30 \
    OUT="$out" bash scripts/gpu_duplex_bench.sh bench 16 "s26_$arm" 2>&1 | tail -6
  # A start that fails to load says why here: its logs are deleted below.
  grep -h -m6 -E 'OutOfMemory|Traceback|Error:' "$out"/server_*.log 2>/dev/null | cut -c1-400
  rm -f "$out"/*.png "$out"/*.log "$out"/compiled*.txt
  rm -rf "$out/stacks"
done
echo "=== done $(date +%T)"
