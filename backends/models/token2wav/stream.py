"""One stream's vocoder state between windows, and the HiFT overlap-add that emits audio.

Emission contract (docs/model_facts.md#code2wav-windows): the HiFT input of a window is the last 8
mel frames of the previous window followed by the new ones, so its first 3840 samples re-cover the
previous window's held tail; those are cross-faded with a Hamming window (halves sum to about
1.08, as in the reference). A non-final window holds its last 3840 samples back, so with 25 new
codes per window the first emits 20160 samples, steady ones 24000, and the final one all it has,
held tail included. Over a stream, 960 samples come out per decoded code.

The rows of one HiFT call are emitted together (`emit_rows`: one cross-fade and one copy per
cache for all of them) and a decode's audio reaches the host in one copy (`to_host`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from backends.models.token2wav.estimator_pool import PoolSlot
from backends.runner.async_output import AsyncOutput
from backends.models.token2wav.flow import FlowCache


@dataclass(slots=True, weakref_slot=True)  # weakref: a dropped stream gives its pool slot back
class Token2WavStream:
    """Created by `Token2Wav.new_stream`, owned and keyed by the caller (one per request)."""

    speaker: torch.Tensor  # [spk_embed_dim] the voice's speaker normalized in the flow's dtype
    prompt_frames: int  # P: prompt mel frames, the origin the cache pruning keeps
    flow_cache: FlowCache  # starts as the voice's setup caches (shared, never written in place)
    generator: torch.Generator  # draws this stream's HiFT source noise, on the model's device
    mel_cache: torch.Tensor  # [80, <= mel_cache_frames] float32 re-fed to the HiFT
    source_cache: torch.Tensor  # [<= overlap_samples] float32 tail of the last source
    speech_tail: torch.Tensor  # [<= overlap_samples] float32 held back for the cross-fade
    num_windows: int = 0
    is_finished: bool = False  # a final window ran; the stream takes no more windows
    # with the cache pool on: where its DiT attention cache lives (flow_cache's is then empty)
    cache_slot: PoolSlot | None = None


def crossfade(speech: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """speech: [S], tail: [n] (n <= S) -> speech with its first n samples faded in over the
    fading-out tail (Hamming window of 2 n, rising half on the new audio)."""
    if tail.shape[0] == 0:
        return speech
    return crossfade_rows(speech[None], tail[None])[0]


def crossfade_rows(speech: torch.Tensor, tails: torch.Tensor) -> torch.Tensor:
    """`crossfade` of every row at once: speech [R, S], tails [R, n] -> a new [R, S]."""
    num = tails.shape[1]
    if num == 0:
        return speech.clone()  # a new tensor: speech may be a CUDA graph's output buffer
    window = _hamming(2 * num, speech.dtype, speech.device)
    head = speech[:, :num] * window[:num] + tails * window[num:]
    return torch.cat([head, speech[:, num:]], dim=1)


@functools.lru_cache(maxsize=8)
def _hamming(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():  # usable in and out of inference mode
        return torch.hamming_window(size, periodic=False, dtype=dtype, device=device)


def emit(
    stream: Token2WavStream,
    mel: torch.Tensor,  # [80, T] the HiFT input of this window (mel cache + new frames)
    speech: torch.Tensor,  # [480 T] HiFT output for `mel`
    source: torch.Tensor,  # [480 T] the source the HiFT used
    last_chunk: bool,
    mel_cache_frames: int,
) -> torch.Tensor:
    """Cross-fade, update the stream's caches and return the samples to send: [k] float32."""
    return emit_rows([stream], mel[None], speech[None], source[None], [last_chunk],
                     mel_cache_frames)[0]


def emit_rows(
    streams: list[Token2WavStream],
    mel: torch.Tensor,  # [R, 80, T] the rows' HiFT inputs
    speech: torch.Tensor,  # [R, 480 T] HiFT output (may be a graph's buffer: not kept)
    source: torch.Tensor,  # [R, 480 T]
    last_chunk: list[bool],
    mel_cache_frames: int,
) -> list[torch.Tensor]:
    """`emit` for rows of one HiFT call: one cross-fade and one copy per cache for all rows
    (rows with equal tails, as rows of one call have) -> the samples to send per row."""
    tails = [s.speech_tail for s in streams]
    if len({t.shape[0] for t in tails}) == 1:
        speech = crossfade_rows(speech, torch.stack(tails))
    else:
        speech = torch.cat([crossfade_rows(row[None], t[None]) for row, t in zip(speech, tails)])
    hop = speech.shape[1] // mel.shape[2]
    num_held = min(mel_cache_frames, mel.shape[2]) * hop
    kept = [not last for last in last_chunk]
    if any(kept):  # one copy each (per-row views of it), so no stream keeps a graph buffer
        _keep_tails(streams, kept, mel[:, :, mel.shape[2] - num_held // hop :].clone(),
                    source[:, source.shape[1] - num_held :].clone(),
                    speech[:, speech.shape[1] - num_held :].clone())
    for stream, last in zip(streams, last_chunk):
        stream.num_windows += 1
        stream.is_finished = stream.is_finished or last
    return [row if last else row[: row.shape[0] - num_held]
            for row, last in zip(speech, last_chunk)]


def _keep_tails(streams: list[Token2WavStream], kept: list[bool], mel: torch.Tensor,
                source: torch.Tensor, speech: torch.Tensor) -> None:
    for j, stream in enumerate(streams):
        if kept[j]:
            stream.mel_cache, stream.source_cache, stream.speech_tail = mel[j], source[j], speech[j]


def to_host(audio: list[torch.Tensor], before_wait: Callable[[], None] | None = None,
            ) -> list[np.ndarray]:
    """Device audio rows -> float32 arrays: on CUDA one gather, one non-blocking copy into
    pinned memory and one sync for all rows (not a blocking copy per stream). The arrays are
    views of that buffer (freed with the last of them). `before_wait` runs once the copy is
    queued: device work it queues runs after the copy, and the host waits for the copy only."""
    if not audio or audio[0].device.type != "cuda":
        rows = [row.float().cpu().numpy() for row in audio]
        if before_wait is not None:
            before_wait()
        return rows
    output = AsyncOutput({"audio": torch.cat([row.float() for row in audio])})
    if before_wait is not None:
        before_wait()
    host = output.wait()["audio"]
    bounds = np.cumsum([row.shape[0] for row in audio])[:-1]
    return np.split(host.numpy(), bounds)


def flush(stream: Token2WavStream) -> torch.Tensor:
    """A final window without codes: emit the held tail as is. -> [n] float32."""
    stream.is_finished = True
    stream.num_windows += 1
    tail, stream.speech_tail = stream.speech_tail, stream.speech_tail[:0]
    return tail
