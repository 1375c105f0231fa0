"""HiFT overlap-add emission (`backends.models.token2wav.stream`) with synthetic renderings.

Strategy: replace the vocoder by renderings of a known smooth signal, so what the emission
logic does at joins is visible exactly: the held tail is cross-faded with the Hamming window,
sample counts follow the 8-frame hold-back, and a rendering mismatch in the overlap is faded
in rather than jumped to. A control without the cross-fade shows the test would catch a click.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.models.token2wav.stream import Token2WavStream, crossfade, emit, flush

HOP = 480
MEL_CACHE = 8
HELD = MEL_CACHE * HOP
MISMATCH = 0.5  # offset of the new rendering over the overlap (a badly matching window)
HAMMING_FLOOR = 0.08  # first weight of the Hamming window


def _stream() -> Token2WavStream:
    return Token2WavStream(
        speaker=torch.ones(4), prompt_frames=0,
        flow_cache=None,  # type: ignore[arg-type]  # unused by the emission logic
        generator=torch.Generator(),
        mel_cache=torch.zeros(80, 0), source_cache=torch.zeros(0), speech_tail=torch.zeros(0),
    )


def _render(start_frame: int, num_frames: int, offset: float = 0.0) -> torch.Tensor:
    """A slow sine over absolute time: what a perfect vocoder gives for these mel frames."""
    t = torch.arange(start_frame * HOP, (start_frame + num_frames) * HOP, dtype=torch.float64)
    return (0.3 * torch.sin(2 * torch.pi * 3.0 * t / 24000) + offset).float()


def _run(num_windows: int, new_frames: int, mismatch: float, fade: bool) -> list[torch.Tensor]:
    """Window k renders the sine plus an offset of `mismatch` on odd k: consecutive windows
    disagree by `mismatch` everywhere, their shared overlap included."""
    stream, chunks, frame = _stream(), [], 0
    for index in range(num_windows):
        cached = stream.mel_cache.shape[1]
        mel = torch.zeros(80, cached + new_frames)
        speech = _render(frame - cached, cached + new_frames, mismatch * (index % 2))
        if not fade:  # control: emit each window's new frames back to back
            stream.speech_tail = stream.speech_tail[:0]
            speech, mel = speech[cached * HOP :], mel[:, cached:]
        source = torch.zeros_like(speech)
        chunks.append(emit(stream, mel, speech, source, index == num_windows - 1, MEL_CACHE))
        frame += new_frames
    return chunks


def test_sample_counts_first_steady_final() -> None:
    chunks = _run(4, 50, 0.0, fade=True)
    assert [len(c) for c in chunks] == [20160, 24000, 24000, 24000 + HELD]


def test_crossfade_uses_the_hamming_halves() -> None:
    speech, tail = torch.ones(10), torch.full((4,), 2.0)
    window = torch.hamming_window(8, periodic=False)
    expected = torch.cat([window[:4] + 2.0 * window[4:], torch.ones(6)])
    torch.testing.assert_close(crossfade(speech, tail), expected)
    assert torch.equal(crossfade(speech, tail[:0]), speech)


def test_mismatched_overlap_is_faded_not_jumped() -> None:
    audio = torch.cat(_run(5, 50, MISMATCH, fade=True))
    steps = audio.diff().abs()
    slope = 0.3 * 2 * np.pi * 3.0 / 24000  # largest step of the sine itself
    # the fade starts and ends at weight 0.08 on the fading side, and in between each weight
    # moves by at most pi / 3840 per sample; the halves sum to at most 1.08
    peak = 0.3 + MISMATCH
    bound = 1.08 * slope + HAMMING_FLOOR * peak + 2 * peak * np.pi / HELD
    assert steps.max() <= bound, (float(steps.max()), bound)


def test_without_crossfade_the_same_mismatch_clicks() -> None:
    """Control: the bound above catches a missing cross-fade."""
    audio = torch.cat(_run(5, 50, MISMATCH, fade=False))
    assert audio.diff().abs().max() > 0.9 * MISMATCH


def test_caches_hold_the_last_8_frames() -> None:
    stream = _stream()
    mel = torch.arange(50, dtype=torch.float32).repeat(80, 1)
    speech = torch.arange(50 * HOP, dtype=torch.float32)
    emit(stream, mel, speech, speech.clone(), False, MEL_CACHE)
    assert stream.mel_cache[0].tolist() == list(range(42, 50))
    assert torch.equal(stream.speech_tail, speech[-HELD:])
    assert torch.equal(stream.source_cache, speech[-HELD:])


def test_flush_emits_the_held_tail_once() -> None:
    stream = _stream()
    emit(stream, torch.zeros(80, 50), _render(0, 50), torch.zeros(50 * HOP), False, MEL_CACHE)
    assert len(flush(stream)) == HELD and stream.is_finished
    assert len(stream.speech_tail) == 0
