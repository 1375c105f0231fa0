"""What the reference feeds the voice models: stepaudio2-minicpmo 0.1.1's `Token2wav._prepare_prompt`,
ported line by line (that module imports torchaudio, s3tokenizer, onnxruntime and hyperpyyaml at
the top, so it cannot be imported here).

    audio = s3tokenizer.load_audio(prompt_wav, sr=16000)          # the clip at 16 kHz
    mels = s3tokenizer.log_mel_spectrogram(audio)                 # 128 bins
    mels, mels_lens = s3tokenizer.padding([mels])
    prompt_speech_tokens, _ = self.audio_tokenizer.quantize(mels.cuda(), mels_lens.cuda())
    spk_feat = kaldi.fbank(audio.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    spk_feat = spk_feat - spk_feat.mean(dim=0, keepdim=True)
    spk_emb = self.spk_model.run(None, {<input 0>: spk_feat.unsqueeze(dim=0).cpu().numpy()})[0]

`quantize` runs the tokenizer graph (ported to torch by s3tokenizer) on (mels, mels_lens), which
is what an onnxruntime session of the same graph is fed. The log-mel below is s3tokenizer's
`log_mel_spectrogram` verbatim, its stored filters read from the installed package when there is
one, else transformers' Slaney filters (equal to 4e-9, checked in
test_token2wav_voice_features.py). The fbank is torchaudio's when it is installed, else ours,
which test_token2wav_voice_features.py checks against torchaudio's (live, and recorded values).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers.audio_utils import mel_filter_bank

from backends.models.token2wav.kaldi_fbank import KaldiFbank


def s3tokenizer_filters() -> torch.Tensor | None:
    """s3tokenizer's stored `mel_128` ([128, 201]) when the package is installed (read without
    importing it: its `__init__` needs onnx and torchaudio), else None."""
    spec = importlib.util.find_spec("s3tokenizer")
    if spec is None or spec.origin is None:
        return None
    with np.load(Path(spec.origin).parent / "assets" / "mel_filters.npz") as stored:
        return torch.from_numpy(stored["mel_128"])


def slaney_filters_128() -> torch.Tensor:
    """librosa.filters.mel(sr=16000, n_fft=400, n_mels=128) as transformers builds it: [128, 201]."""
    filters = mel_filter_bank(num_frequency_bins=201, num_mel_filters=128, min_frequency=0.0,
                              max_frequency=8000.0, sampling_rate=16000, norm="slaney",
                              mel_scale="slaney")
    return torch.from_numpy(filters).float().T.contiguous()


def log_mel_spectrogram(audio: torch.Tensor) -> torch.Tensor:
    """s3tokenizer.log_mel_spectrogram(audio, n_mels=128, padding=0)."""
    window = torch.hann_window(400).to(audio.device)
    stft = torch.stft(audio, 400, 160, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    filters = s3tokenizer_filters()
    filters = slaney_filters_128() if filters is None else filters
    mel_spec = filters @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    log_spec = (log_spec + 4.0) / 4.0
    return log_spec


def padding(data: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """s3tokenizer.padding."""
    feats_lengths = torch.tensor([s.size(1) for s in data], dtype=torch.int32)
    feats = [s.t() for s in data]
    padded_feats = pad_sequence(feats, batch_first=True, padding_value=0)
    return padded_feats.transpose(1, 2), feats_lengths


def fbank(waveform: torch.Tensor, **options: float) -> torch.Tensor:
    """torchaudio.compliance.kaldi.fbank when torchaudio is installed, else ours (same options)."""
    if importlib.util.find_spec("torchaudio") is not None:
        import torchaudio.compliance.kaldi as kaldi

        return kaldi.fbank(waveform, **options)
    assert options == {"num_mel_bins": 80, "dither": 0, "sample_frequency": 16000}
    return KaldiFbank()(waveform[0])


def reference_feeds(audio: torch.Tensor) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """audio: [L] float32 at 16 kHz -> ((tokenizer mels, mels_lens), campplus features) as numpy."""
    mels = log_mel_spectrogram(audio)
    mels, mels_lens = padding([mels])
    spk_feat = fbank(audio.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    spk_feat = spk_feat - spk_feat.mean(dim=0, keepdim=True)
    return (mels.numpy(), mels_lens.numpy()), spk_feat.unsqueeze(dim=0).cpu().numpy()
