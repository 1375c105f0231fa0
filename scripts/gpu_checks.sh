#!/usr/bin/env bash
# Every GPU test and GPU benchmark in one run (on the GPU machine, from the repo root).
#
#   COMMIT=$(git rev-parse HEAD) scripts/gpu_checks.sh [OUT_DIR]
#
# Logs and result files go to OUT_DIR (default: $OUT when set, else perf/out).
# To add a check, append one `check NAME COMMAND...` line below; a failing check is reported
# and the others still run; the exit status is non-zero if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-perf/out}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
failed=()

check() {
    local name=$1
    shift
    echo "=== $name: $*"
    local start=$SECONDS
    if ! "$@" 2>&1 | tee "$out/$name.log"; then
        failed+=("$name")
    fi
    echo "=== $name: $((SECONDS - start)) s"
}

nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem --format=csv || true
check gpu_tests "$python" -m pytest -q -p no:cacheprovider tests/runner_gpu \
    tests/talker/test_fused_draw_gpu.py tests/talker/test_device_policy_gpu.py \
    tests/talker/test_decode_chains_gpu.py tests/audio/test_encoder_graphs.py \
    tests/audio/test_batched_encoder.py tests/models/test_chunk_attention_kernel.py
check gpu_tests_token2wav "$python" -m pytest -q -p no:cacheprovider -m gpu tests/models/token2wav
check bench_runner "$python" perf/bench_runner.py --out "$out" --commit "${COMMIT:-unknown}"
check bench_talker_chains "$python" perf/bench_runner.py --quick --talker-only --chain-lengths 4,8,16 \
    --out "$out/talker_chains" --commit "${COMMIT:-unknown}"
# The paged decode attention's key tiles (64 / 128) per batch and length, and the launcher's pick.
check bench_attention "$python" perf/bench_attention.py --out "$out/attention_tiles.md"
# Code2Wav's cache-pool write after a window: the copy kernel against torch indexing.
check bench_pool_commit "$python" perf/bench_pool_commit.py
# The decode GEMV per shape (Thinker, Talker), and where folding the norms / SwiGLU into it pays.
check bench_gemv "$python" perf/bench_gemv.py --out "$out/gemv_thinker.md"
check bench_gemv_talker "$python" perf/bench_gemv.py --model talker --out "$out/gemv_talker.md"
check bench_gemv_prologue "$python" perf/bench_gemv_prologue.py --budget-s 240 --out "$out/gemv_prologue.md"
# The Talker's fused draw against the torch draw; Code2Wav's HiFT with and without its fused kernels.
check bench_talker_draw "$python" perf/bench_talker_draw.py --batches 1,16 --num-warps 4,8
check bench_policy_draw "$python" perf/bench_policy_draw.py
check profile_hift "$python" perf/profile_code2wav.py --hift-batches 1,16 --repeats 20
# Where a window's time goes without the profiler: host entry / exit and device span per graphed part.
check window_timeline "$python" perf/window_timeline.py --batches 1,16 --idle-s 0,1 --out "$out/window_timeline.md"
check bench_code2wav "$python" perf/bench_audio_tail.py --stages code2wav --repeats 3 --batches 1,4,8,16 \
    --code2wav-modes on+bf16+pool --out "$out/audio_tail_code2wav.md" --commit "${COMMIT:-unknown}"
check profile_talker_engine "$python" perf/profile_talker_engine.py --batch 1,16 --no-cprofile
# The Thinker's graphed audio-encoder pass per sessions and held frames, q/k/v packed or not.
check bench_audio_encoder "$python" perf/bench_audio_encoder.py
# Served Thinker in-process: unit latency with C paced sessions, host profile at C=8.
check bench_thinker_engine "$python" perf/bench_thinker_engine.py --concurrency 1,8,32 --seconds 8 \
    --profile 8
# Talker time to 25 frames: chunk policy on the device (default), then the host hook it replaced.
check bench_talker "$python" perf/bench_audio_tail.py --stages talker --repeats 3 \
    --out "$out/audio_tail_talker.md" --commit "${COMMIT:-unknown}"
check bench_talker_host_policy "$python" perf/bench_audio_tail.py --stages talker --repeats 3 \
    --batches 1,16 --talker-policy host --out "$out/audio_tail_talker_host.md" \
    --commit "${COMMIT:-unknown}"

if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all GPU checks passed"
