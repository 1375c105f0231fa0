"""Warm a stage engine before it serves: kernel variants compile at load, not mid-reply.

Triton kernels compile on first use of each specialisation (an integer argument equal to 1 or
divisible by 16, the append and decode row tiles, ...), each compile stalling the engine
thread for ~0.3-1 s. Unwarmed, the first sessions of a new batch size paid that inside their
first reply (Thinker at C=8 on an H200: first-unit latency 1.3 s instead of ~0.1 s). The
warm-up drives the engine through its public API as sessions would: groups of 1, 2, 3 and
up to 32 concurrent requests, each a few appends long (Thinker: a text prompt, then silent
units through a forced reply; Talker: speak-unit conditions of random hidden rows), then
stops them. It must leave nothing behind: every KV block free, no request held.

Code2Wav captures a CUDA graph per window shape: its groups are the batch buckets (1, 2, 4, 8)
and each stream runs first, growing, steady and final windows, so serving replays graphs
captured here (unwarmed, an H200 at 32 sessions spent a quarter of the Code2Wav thread's time
capturing graphs mid-reply).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from backends.audio.codec_windows import CodecWindowBridge, CodecWindowConfig
from backends.contracts.messages import Code2WavRequest, TalkerRequest, ThinkerRequest
from backends.contracts.sink import ListSink
from backends.models.token2wav.batch_buckets import BATCH_BUCKETS, batch_bucket
from backends.stages.code2wav_engine import request_from_window
from backends.thinker.prompt_layout import UNIT_SAMPLES

logger = logging.getLogger(__name__)

APPENDS_PER_REQUEST = 3
MAX_STEPS = 5000  # far above what a group needs: a stuck engine fails the load
WARMUP_PROMPT = "Warm-up: say a few words about the weather."
# resource counts that must be back to zero after a warm-up (each engine has some of them)
HELD_COUNTS = ("requests", "runner_requests", "codec_states", "codec_sequences", "codec_pending")
CODE2WAV_WINDOWS = 5  # first, second (cache growing), two steady (cache cut) and a final window
# New codes in a warm-up stream's final window: 24, the frame bucket (56) that no other window
# has; final windows of 0-22 new codes share the steady windows' graphs
# (backends/models/token2wav/graphs.py FRAME_BUCKETS).
CODE2WAV_FINAL_FRAMES = (24,)
# The HiFT, though, runs a final window at the window's own length (14 + 2 x new codes mel
# frames: its convolutions see the window's end, so it cannot pad as the flow does) and its
# graphs are sealed after the warm-up: a final length no warm-up stream ended on ran its HiFT
# eagerly, ~16 ms of the engine thread per reply on an H200 (stack samples of a served
# benchmark) that other replies' first windows waited behind.
# So a lone stream per other final length: its flow replays the steady windows' graphs, its
# final window captures that length's HiFT graph.
CODE2WAV_LONE_FINAL_FRAMES = tuple(new for new in range(CodecWindowConfig().chunk_frames)
                                   if new not in CODE2WAV_FINAL_FRAMES)

CODE2WAV_CODEBOOK = 6561  # speech codes (the vocoder's vocabulary; the Talker adds EOS ids)
RequestMaker = Callable[[str, int], Any]  # (request id, append index) -> a stage request


def warmup_group_sizes(max_sessions: int) -> list[int]:
    """Request counts to run together: 1, 2, 3 and the largest multiple of 16 up to 32."""
    sizes = {n for n in (1, 2, 3) if n <= max_sessions}
    if max_sessions >= 16:
        sizes.add(min(32, max_sessions) // 16 * 16)
    return sorted(sizes)


def warm_up(engine: Any, name: str, make_request: RequestMaker, max_sessions: int,
            sizes: list[int] | None = None, appends: int = APPENDS_PER_REQUEST) -> float:
    """Run groups of `sizes` requests (default `warmup_group_sizes`), each `appends` requests
    long, on `engine` (stepped on this thread); returns the seconds taken. Raises if a warm-up
    request fails or anything is left held."""
    started = time.perf_counter()
    sizes = warmup_group_sizes(max_sessions) if sizes is None else sizes
    for size in sizes:
        _run_group(engine, f"__warmup{size}", size, make_request, appends)
    counts = engine.resource_counts()
    held = {key: counts[key] for key in HELD_COUNTS if counts.get(key)}
    if held or counts.get("kv_free_blocks") != counts.get("kv_blocks"):
        raise RuntimeError(f"{name} warm-up left state behind: {counts}")
    elapsed = time.perf_counter() - started
    logger.info("%s warm-up (groups %s) took %.1f s%s", name, sizes, elapsed, cuda_memory_note())
    return elapsed


def cuda_memory_note() -> str:
    """The allocator's peak and current use on this process's GPU, for the load log: how close
    a stage came to its memory share (`<stage>_memory_fraction`); empty without CUDA."""
    if not torch.cuda.is_initialized():
        return ""
    gib = 1 << 30
    return (f"; CUDA memory peak {torch.cuda.max_memory_reserved() / gib:.2f} GiB reserved "
            f"({torch.cuda.max_memory_allocated() / gib:.2f} GiB allocated), now "
            f"{torch.cuda.memory_reserved() / gib:.2f} GiB reserved")


def thinker_request(request_id: str, index: int) -> ThinkerRequest:
    """A session that opens with a text prompt and answers in two forced speak units."""
    first = index == 0
    return ThinkerRequest(
        request_id=request_id, audio=np.zeros(UNIT_SAMPLES, np.float32), seq=index,
        initial_user_text=WARMUP_PROMPT if first else "",
        reply_units=2 if first else 0, reply_tokens_per_unit=4 if first else 0,
    )  # fmt: skip


def talker_request_maker(llm_hidden: int, text_token: int) -> RequestMaker:
    """Speak-unit conditions of 4 handed tokens with random (seeded) hidden rows."""
    hidden = np.random.default_rng(0).standard_normal((4, llm_hidden)).astype(np.float32)
    tokens = np.full(4, text_token, np.int32)

    def make(request_id: str, index: int) -> TalkerRequest:
        return TalkerRequest(request_id=request_id, condition_seq=index, token_ids=tokens,
                             hidden=hidden, turn_start=index == 0)

    return make


def code2wav_warmup_sizes(max_batch: int, pool_streams: int) -> list[int]:
    """Group sizes whose windows form every batch bucket the engine can run (at most
    `max_batch` windows per forward, at most `pool_streams` live streams)."""
    top = min(max_batch, pool_streams)
    return sorted({min(bucket, top) for bucket in BATCH_BUCKETS if bucket <= batch_bucket(top)})


def code2wav_request_maker(
    num_windows: int = CODE2WAV_WINDOWS, seed: int = 0, final_frames: int = 10
) -> RequestMaker:
    """Each request a stream of full 25-frame windows, then a final window of `final_frames`
    new frames (0: the look-ahead flush alone), as the duplex codec bridge cuts them (left
    context, sequence numbers, terminal flush)."""
    rng = np.random.default_rng(seed)
    bridges: dict[str, CodecWindowBridge] = {}

    def make(request_id: str, index: int) -> Code2WavRequest:
        bridge = bridges.setdefault(request_id, CodecWindowBridge())
        frames = bridge.config.chunk_frames if index < num_windows - 1 else final_frames
        windows = bridge.push(rng.integers(0, CODE2WAV_CODEBOOK, frames).tolist())
        if index == num_windows - 1:
            windows += bridge.end_turn()
            del bridges[request_id]
        (window,) = windows
        return request_from_window(request_id, window)

    return make


def warm_up_code2wav(service: Any, max_sessions: int, max_batch: int, pool_streams: int) -> float:
    """Whole streams through every batch bucket, once per final-window shape, then a lone
    stream ending on each other final length (`CODE2WAV_LONE_FINAL_FRAMES`); returns seconds."""
    sizes = code2wav_warmup_sizes(max_batch, pool_streams)
    seconds = sum(warm_up(service, "code2wav", code2wav_request_maker(final_frames=final), max_sessions,
                          sizes, CODE2WAV_WINDOWS) for final in CODE2WAV_FINAL_FRAMES)  # fmt: skip
    return seconds + sum(warm_up(service, f"code2wav (final window of {final} codes)",
                                 code2wav_request_maker(final_frames=final), max_sessions, [1], CODE2WAV_WINDOWS)
                         for final in CODE2WAV_LONE_FINAL_FRAMES)  # fmt: skip


def _run_group(engine: Any, prefix: str, size: int, make_request: RequestMaker, appends: int) -> None:
    ids = [f"{prefix}.{i}.e0" for i in range(size)]
    try:
        for index in range(appends):
            sinks = []
            for request_id in ids:
                sinks.append(ListSink())
                engine.submit(make_request(request_id, index), sinks[-1])
            _step_until_closed(engine, sinks)
    finally:
        for request_id in ids:
            engine.stop(request_id)


def _step_until_closed(engine: Any, sinks: list[ListSink]) -> None:
    for _ in range(MAX_STEPS):
        if all(sink.closed for sink in sinks):
            break
        engine.step()
    failed = [sink.error for sink in sinks if not sink.closed or sink.error is not None]
    if failed:
        raise RuntimeError(f"warm-up request failed: {failed[0] or 'did not finish'}")
