"""One stream's vocoder state between windows, and the HiFT overlap-add that emits audio.

Emission contract (token2wav_facts.md 1.9): the HiFT input of a window is the last 8 mel frames
of the previous window followed by the new ones, so its first 3840 samples re-cover the
previous window's held tail; those are cross-faded with a Hamming window (halves sum to about
1.08, as in the reference). A non-final window holds its last 3840 samples back, so with 25
new codes per window the first emits 20160 samples, steady ones 24000, and the final one all
it has, held tail included. Over a stream, 960 samples come out per decoded code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.models.token2wav.estimator_pool import PoolSlot
from backends.models.token2wav.flow import FlowCache


@dataclass(slots=True, weakref_slot=True)  # weakref: a dropped stream gives its pool slot back
class Token2WavStream:
    """Created by `Token2Wav.new_stream`, owned and keyed by the caller (one per request)."""

    speaker: torch.Tensor  # [spk_embed_dim] float32
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
    num = tail.shape[0]
    if num == 0:
        return speech
    window = torch.hamming_window(2 * num, periodic=False, dtype=speech.dtype, device=speech.device)
    head = speech[:num] * window[:num] + tail * window[num:]
    return torch.cat([head, speech[num:]])


def emit(
    stream: Token2WavStream,
    mel: torch.Tensor,  # [80, T] the HiFT input of this window (mel cache + new frames)
    speech: torch.Tensor,  # [480 T] HiFT output for `mel`
    source: torch.Tensor,  # [480 T] the source the HiFT used
    last_chunk: bool,
    mel_cache_frames: int,
) -> torch.Tensor:
    """Cross-fade, update the stream's caches and return the samples to send: [k] float32."""
    speech = crossfade(speech, stream.speech_tail)
    stream.num_windows += 1
    if last_chunk:
        stream.is_finished = True
        return speech
    hop = speech.shape[0] // mel.shape[1]
    num_held = min(mel_cache_frames, mel.shape[1]) * hop
    stream.mel_cache = mel[:, mel.shape[1] - num_held // hop :].clone()
    stream.source_cache = source[source.shape[0] - num_held :].clone()
    stream.speech_tail = speech[speech.shape[0] - num_held :].clone()
    return speech[: speech.shape[0] - num_held]


def flush(stream: Token2WavStream) -> torch.Tensor:
    """A final window without codes: emit the held tail as is. -> [n] float32."""
    stream.is_finished = True
    stream.num_windows += 1
    tail, stream.speech_tail = stream.speech_tail, stream.speech_tail[:0]
    return tail
