"""The HiFT vocoder and its NSF source against the reference (stepaudio2-minicpmo 0.1.1).

Strategy: the reference HiFT is built with the tiny widths, random weights and a voiced F0
head (so the harmonic source is compared, not only noise); its weight-normalised state dict is
folded into ours. Ours takes the source noise as an argument, so the reference's own draws are
reproduced (`reference_noise`) and injected: whole input, then a window re-fed with a cached
source as streaming does. Also checked: the excitation's noise level per voicing.
"""

from __future__ import annotations

import torch

from backends.models.token2wav import Token2WavConfig
from backends.models.token2wav.nsf_source import SourceModuleHnNSF
from stepaudio2_reference import reference_noise

# Measured 5e-7 on the audio and 2e-6 on the source: complex-exponential vs cos/sin rounding in
# the ISTFT, and sines of phases up to ~1e4 rad; a wrong stage, slope or noise layout is > 1e-2.
AUDIO_ATOL = 1e-5
SOURCE_ATOL = 2e-5
FRAMES = 58  # a steady window: 8 cached + 50 new mel frames
HELD = 3840


def _mel(seed: int) -> torch.Tensor:
    return torch.randn(1, 80, FRAMES, generator=torch.Generator().manual_seed(seed)) * 2 - 5


def test_whole_input_equals_reference(pair) -> None:
    mel = _mel(0)
    with torch.inference_mode():
        noise = reference_noise(7, FRAMES)
        torch.manual_seed(7)
        expected, expected_source = pair.ref_hift(mel)
        got, source = pair.ours.hift(mel, [torch.zeros(0)], noise)
    torch.testing.assert_close(got, expected, atol=AUDIO_ATOL, rtol=0)
    torch.testing.assert_close(source, expected_source[:, 0], atol=SOURCE_ATOL, rtol=0)


def test_cached_source_window_equals_reference(pair) -> None:
    mel = _mel(1)
    cached = torch.randn(1, 1, HELD, generator=torch.Generator().manual_seed(2)) * 0.1
    with torch.inference_mode():
        noise = reference_noise(8, FRAMES)
        torch.manual_seed(8)
        expected, expected_source = pair.ref_hift(mel, cached)
        got, source = pair.ours.hift(mel, [cached[0, 0]], noise)
    torch.testing.assert_close(got, expected, atol=AUDIO_ATOL, rtol=0)
    torch.testing.assert_close(source, expected_source[:, 0], atol=SOURCE_ATOL, rtol=0)
    assert torch.equal(source[0, :HELD], cached[0, 0])


def test_source_noise_level_follows_voicing() -> None:
    """Unvoiced frames (F0 <= 10 Hz) carry noise of std alpha / 3 and no sines; voiced ones
    sines of amplitude alpha plus noise of std sigma."""
    config = Token2WavConfig.tiny().hift
    m_source = SourceModuleHnNSF(config.nb_harmonics, config.sampling_rate, 480,
                                 config.nsf_alpha, config.nsf_sigma, config.nsf_voiced_threshold)
    f0 = torch.tensor([[0.0] * 10 + [150.0] * 10])
    noise = torch.randn(1, 20 * 480, 9, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        m_source.l_linear.weight.copy_(torch.eye(1, 9))  # read the fundamental channel only
        m_source.l_linear.bias.zero_()
        source = torch.atanh(m_source(f0, noise))
    unvoiced, voiced = source[0, : 10 * 480], source[0, 11 * 480 :]
    torch.testing.assert_close(unvoiced, noise[0, : 10 * 480, 0] * 0.1 / 3, atol=1e-5, rtol=0)
    voiced_noise = noise[0, 11 * 480 :, 0] * 0.003
    sines = voiced - voiced_noise
    assert 0.099 < sines.abs().max() <= 0.1 + 1e-5
