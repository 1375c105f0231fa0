"""The S3 speech tokenizer's input: Whisper's 128-bin log-mel of a whole 16 kHz clip.

As the `s3tokenizer` package's `log_mel_spectrogram(audio, n_mels=128)` (which the reference
feeds to the tokenizer): a centred STFT of 400 with hop 160 (reflect padding, periodic Hann
window), the last frame dropped, power through 128 Slaney mel filters over 0..8 kHz
(librosa's, the package's stored `mel_128`), log10 after a 1e-10 clamp, floored at the
clip's peak minus 8, then (x + 4) / 4. A clip of L samples gives L // 160 frames; the floor
depends on the whole clip, so a prompt is always computed whole.
"""

from __future__ import annotations

import torch

from backends.models.whisper_mel import DYNAMIC_RANGE, HOP_LENGTH, LOG_CLAMP, N_FFT, slaney_mel_filters

NUM_MEL_BINS = 128


class S3LogMel:
    """Window and filters built once; `__call__` maps a 16 kHz clip to the tokenizer's input."""

    def __init__(self) -> None:
        self.window = torch.hann_window(N_FFT)  # periodic
        self.filters = slaney_mel_filters(NUM_MEL_BINS).T.contiguous()  # [128, 201]

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """audio: [L] float32 at 16 kHz, L > 200 -> [128, L // 160] float32."""
        if audio.ndim != 1 or audio.shape[0] <= N_FFT // 2:
            raise ValueError(f"the tokenizer's mel needs a 1-D clip of more than {N_FFT // 2} "
                             f"samples, got {tuple(audio.shape)}")
        spec = torch.stft(audio.float(), N_FFT, HOP_LENGTH, window=self.window, return_complex=True)
        power = spec[..., :-1].abs() ** 2
        log_spec = torch.clamp(self.filters @ power, min=LOG_CLAMP).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - DYNAMIC_RANGE)
        return (log_spec + 4.0) / 4.0
