"""Whisper log-mel spectrogram in torch, for clips of any length (no 30 s padding).

The math is that of transformers' WhisperFeatureExtractor: frame i of a clip of L samples is
centred on sample 160 * i, reflect-padded where its 400-sample window crosses an edge of the
clip, weighted by a periodic Hann window; its power spectrum goes through 80 Slaney mel filters
and log10 after a 1e-10 clamp. A clip yields L // 160 frames (the extractor drops the last STFT
frame). Values are then floored and scaled by (x + 4) / 4. Whisper's floor is (peak - 8) over
the clip; MiniCPM-o's streaming processor uses a fixed floor on short buffers, so the floor is
an argument of `normalize_log_mel`.

`WhisperMel.raw_frames(samples, first, stop)` computes any frame range of a clip from only the
samples that range needs, which keeps the streaming front end incremental.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
NUM_MEL_BINS = 80
LOG_CLAMP = 1e-10  # power floor before log10, as Whisper
DYNAMIC_RANGE = 8.0  # Whisper keeps 8 log10 units (80 dB) below the peak of the clip

# Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, then logarithmic (27 mels per
# factor 6.4).
_HZ_PER_LINEAR_MEL = 200.0 / 3.0
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _HZ_PER_LINEAR_MEL
_LOG_MEL_STEP = math.log(6.4) / 27.0


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    octaves = np.log(np.maximum(hz, _LOG_START_HZ) / _LOG_START_HZ)
    log_part = _LOG_START_MEL + octaves / _LOG_MEL_STEP
    return np.where(hz >= _LOG_START_HZ, log_part, hz / _HZ_PER_LINEAR_MEL)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    log_part = _LOG_START_HZ * np.exp(_LOG_MEL_STEP * (mel - _LOG_START_MEL))
    return np.where(mel >= _LOG_START_MEL, log_part, mel * _HZ_PER_LINEAR_MEL)


def slaney_mel_filters(
    num_mel_bins: int = NUM_MEL_BINS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE
) -> torch.Tensor:
    """Area-normalised triangular filters from 0 Hz to Nyquist:
    [n_fft // 2 + 1, num_mel_bins] float32."""
    # float64 throughout, cast once at the end, as the extractor builds its filters
    fft_hz = np.linspace(0.0, sample_rate // 2, n_fft // 2 + 1)
    edge_mels = np.linspace(0.0, _hz_to_slaney_mel(np.array(sample_rate / 2.0)), num_mel_bins + 2)
    edge_hz = _slaney_mel_to_hz(edge_mels)
    lower, centre, upper = edge_hz[:-2], edge_hz[1:-1], edge_hz[2:]
    rising = (fft_hz[:, None] - lower) / (centre - lower)
    falling = (upper - fft_hz[:, None]) / (upper - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return torch.from_numpy(triangles * (2.0 / (upper - lower))).to(torch.float32)


def num_frames(num_samples: int) -> int:
    """Frames Whisper gives a clip of `num_samples` (the last STFT frame is dropped)."""
    return num_samples // HOP_LENGTH


def normalize_log_mel(raw: torch.Tensor, floor: float | torch.Tensor) -> torch.Tensor:
    """Floor raw log10 mel power and scale it to Whisper's input range: same shape as `raw`."""
    return (torch.maximum(raw, torch.as_tensor(floor, dtype=raw.dtype)) + 4.0) / 4.0


def whisper_floor(raw: torch.Tensor) -> torch.Tensor:
    """Whisper's dynamic floor over the frames normalised together: scalar float32."""
    return raw.max() - DYNAMIC_RANGE


class WhisperMel:
    """Hann window and mel filters of the Whisper front end, built once and reused per clip."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.window = torch.hann_window(N_FFT, device=device)  # [N_FFT] float32, periodic
        self.filters = slaney_mel_filters().to(device)  # [N_FFT // 2 + 1, NUM_MEL_BINS] float32

    def raw_frames(self, samples: torch.Tensor, first: int, stop: int) -> torch.Tensor:
        """log10 mel power of frames [first, stop) of the clip `samples` ([L] float32).

        Returns [NUM_MEL_BINS, stop - first] float32, equal to the same columns of the whole
        clip's centred STFT; only the samples under those frames (plus edge reflections) are read.
        """
        _check_clip(samples)
        if not 0 <= first <= stop <= num_frames(samples.shape[0]):
            total = samples.shape[0]
            raise ValueError(
                f"frame range [{first}, {stop}) is outside the {num_frames(total)} frames "
                f"of a {total}-sample clip"
            )
        if first == stop:
            return samples.new_zeros(NUM_MEL_BINS, 0)
        segment = _frame_segment(samples, first, stop)
        spectrum = torch.stft(
            segment, N_FFT, HOP_LENGTH, window=self.window, center=False, return_complex=True
        )  # [N_FFT // 2 + 1, stop - first] complex64
        mel_power = self.filters.T @ (spectrum.abs() ** 2)
        return torch.clamp(mel_power, min=LOG_CLAMP).log10()

    def spectrogram(self, samples: torch.Tensor) -> torch.Tensor:
        """Whisper log-mel of a whole clip ([L] float32): [NUM_MEL_BINS, L // 160] float32."""
        raw = self.raw_frames(samples, 0, num_frames(samples.shape[0]))
        return normalize_log_mel(raw, whisper_floor(raw))


def _check_clip(samples: torch.Tensor) -> None:
    if samples.ndim != 1 or samples.dtype != torch.float32:
        raise ValueError(
            f"samples must be a 1-D float32 tensor, got shape {tuple(samples.shape)} "
            f"{samples.dtype}"
        )
    # the centred STFT reflects 200 samples at each edge, which needs more than 200 samples
    if samples.shape[0] <= N_FFT // 2:
        raise ValueError(f"a clip needs more than {N_FFT // 2} samples, got {samples.shape[0]}")


def _frame_segment(samples: torch.Tensor, first: int, stop: int) -> torch.Tensor:
    """Samples under frames [first, stop) with reflect padding where a window leaves the clip:
    [(stop - first - 1) * HOP_LENGTH + N_FFT] float32."""
    total = samples.shape[0]
    start = first * HOP_LENGTH - N_FFT // 2
    end = (stop - 1) * HOP_LENGTH + N_FFT // 2
    # reflection excludes the edge sample itself, as torch's "reflect" padding does
    left = samples[1 : 1 - start].flip(0) if start < 0 else samples[:0]
    right = samples[2 * total - 1 - end : total - 1].flip(0) if end > total else samples[:0]
    return torch.cat([left, samples[max(start, 0) : min(end, total)], right])
