"""The real voice path (`voice_onnx`, `voice_assets`): campplus and the S3 tokenizer run with
onnxruntime, fed exactly what the reference feeds them.

Strategy: small models with the real input/output signatures are exported with
`torch.onnx.export` (`voice_onnx_models`); sessions wrapped in a recorder keep every feed, which
must equal the line-by-line port of the reference's `_prepare_prompt` (`voice_reference`) on the
same clip: the whole clip for a clip of 6 s or more, the clip zero-padded to 6 s for the
tokenizer of a shorter one (the prompt length rule, docs/model_facts.md#code2wav-token2wav). The
codes and speaker must be the sessions' outputs for those feeds, cut to the prompt. The assets
rules (both files, neither, one) and the provider choice are checked directly.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
from pathlib import Path

import onnxruntime
import pytest
import torch

from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.models.token2wav import Token2WavConfig
from backends.models.token2wav.assets import load_token2wav, write_token2wav_assets
from backends.models.token2wav.prompt_mel import PromptMel
from backends.models.token2wav.resample import resample
from backends.models.token2wav.voice import build_voice_prompt
from backends.models.token2wav.voice_assets import (
    CAMPPLUS_FILE,
    SPEECH_TOKENIZER_FILE,
    VoiceAssetsError,
    load_voice_encoder,
)
from backends.models.token2wav.voice_onnx import OnnxVoiceEncoder, session_providers
from backends.models.token2wav.voice_standin import StandinVoiceEncoder
from voice_onnx_models import export_voice_models
from voice_recording import PROMPT_CODES, assert_reference_feeds, expected_outputs, recording

@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_voice_models(tmp_path_factory.mktemp("voice_models"))


@pytest.fixture(scope="module")
def encoder(models_dir: Path) -> OnnxVoiceEncoder:
    loaded = load_voice_encoder(models_dir, "cpu", 6561, 192)
    assert isinstance(loaded, OnnxVoiceEncoder)
    return loaded


def _clip(seed: int, seconds: float, rate: int = 16000) -> torch.Tensor:
    return torch.from_numpy(synthesize_reference_voice(seed, rate, seconds)).float()


@pytest.mark.parametrize("seconds", [6.016, 2.5, 9.0])
def test_feeds_are_the_references_and_the_prompt_keeps_the_outputs(encoder, seconds: float) -> None:
    spy = recording(encoder)
    clip = _clip(7, seconds)
    prompt = build_voice_prompt(clip, 16000, 6.0, spy)
    assert len(spy.tokenizer.feeds) == 1 and len(spy.campplus.feeds) == 1
    assert_reference_feeds(spy, clip)
    codes, speaker = expected_outputs(spy)
    assert prompt.codes.dtype == torch.int64 and torch.equal(prompt.codes, codes)
    assert torch.equal(prompt.speaker, speaker) and prompt.speaker.shape == (192,)
    assert len(set(prompt.codes.tolist())) > 10  # the model's codes, not a constant


def test_a_clip_at_another_rate_is_resampled_to_16k_first(encoder) -> None:
    spy = recording(encoder)
    clip_24k = _clip(8, 6.1, rate=24000)
    build_voice_prompt(clip_24k, 24000, 6.0, spy)
    assert_reference_feeds(spy, resample(clip_24k, 24000, 16000))


def test_concurrent_voices_share_the_sessions(encoder) -> None:
    clips = [_clip(seed, 3.0) for seed in range(4)]
    alone = [encoder.encode(c, PROMPT_CODES) for c in clips]
    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def encode(i: int) -> None:
        results[i] = encoder.encode(clips[i], PROMPT_CODES)

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(len(clips))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, (codes, speaker) in enumerate(alone):
        assert torch.equal(results[i][0], codes) and torch.equal(results[i][1], speaker)


def test_default_voice_of_a_loaded_checkpoint_uses_the_models(models_dir, tmp_path) -> None:
    assets = write_token2wav_assets(tmp_path, Token2WavConfig.tiny(), seed=0)
    for name in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        shutil.copy(models_dir / name, assets / name)
    model = load_token2wav(assets)
    assert isinstance(model.voice_encoder, OnnxVoiceEncoder)
    model.voice_encoder = recording(model.voice_encoder)
    clip = _clip(0, 6.016)
    voice = model.voice_from_audio(clip, 16000)
    assert_reference_feeds(model.voice_encoder, clip)
    codes, speaker = expected_outputs(model.voice_encoder)
    assert torch.equal(voice.prompt.codes, codes) and torch.equal(voice.prompt.speaker, speaker)
    whole_mel = PromptMel()(resample(clip, 16000, 24000))
    assert torch.equal(voice.prompt.mel, whole_mel[:300])


def test_without_the_models_the_standins_are_used_and_logged(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="backends.models.token2wav.voice_assets"):
        encoder = load_voice_encoder(tmp_path, "cpu", 6561, 192)
    assert isinstance(encoder, StandinVoiceEncoder)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "stand-ins" in record.getMessage()
    assert CAMPPLUS_FILE in record.getMessage() and SPEECH_TOKENIZER_FILE in record.getMessage()


@pytest.mark.parametrize("present", [CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE])
def test_one_model_without_the_other_is_an_error_naming_it(models_dir, tmp_path, present: str) -> None:
    shutil.copy(models_dir / present, tmp_path / present)
    missing = SPEECH_TOKENIZER_FILE if present == CAMPPLUS_FILE else CAMPPLUS_FILE
    with pytest.raises(VoiceAssetsError, match=f"missing {missing}"):
        load_voice_encoder(tmp_path, "cpu", 6561, 192)


def test_loaded_models_are_logged_with_their_provider(models_dir, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="backends.models.token2wav.voice_assets"):
        load_voice_encoder(models_dir, "cpu", 6561, 192)
    [record] = caplog.records
    assert "onnxruntime" in record.getMessage() and "CPUExecutionProvider" in record.getMessage()


def test_cuda_provider_on_a_cuda_stage_when_installed(monkeypatch) -> None:
    assert session_providers(torch.device("cpu")) == ["CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session_providers(torch.device("cuda:1")) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert session_providers(torch.device("cpu")) == ["CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert session_providers(torch.device("cuda:0")) == ["CPUExecutionProvider"]


def test_outputs_the_flow_cannot_use_are_errors(encoder) -> None:
    clip = _clip(1, 2.0)
    with pytest.raises(ValueError, match="campplus returned 192 values, the flow needs 80"):
        dataclasses.replace(encoder, spk_embed_dim=80).encode(clip, PROMPT_CODES)
    with pytest.raises(ValueError, match="codes outside 0..99"):
        dataclasses.replace(encoder, vocab_size=100).encode(clip, PROMPT_CODES)
    with pytest.raises(ValueError, match="expected 2 input"):
        dataclasses.replace(encoder, tokenizer=encoder.campplus)
