"""The real voice path through the Code2Wav stage: a checkpoint whose `assets/token2wav/` has
campplus and the S3 tokenizer gets its default voice and every session's REF_AUDIO from them.

Strategy: the tiny checkpoint plus the small exported models of the real signatures
(`voice_onnx_models`), loaded by the stage factory as the server loads it; the voice encoder's
sessions are wrapped in recorders, and their feeds must be the reference's for the default clip
(HT_ref_audio.wav) and for the session's reference clip (`voice_reference`), the prompts must
hold the sessions' outputs, and the referenced stream must sound different from the default one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from backends.audio.codec_windows import CodecWindowBridge
from backends.checkpoint import ensure_tiny_checkpoint, load_checkpoint
from backends.checkpoint.reference_voice import synthesize_reference_voice
from backends.contracts.messages import Code2WavRequest
from backends.models.token2wav.assets import ASSET_SUBDIR
from backends.models.token2wav.resample import resample
from backends.models.token2wav.voice_assets import CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE
from backends.models.token2wav.voice_onnx import OnnxVoiceEncoder
from backends.stages.code2wav_engine import Code2WavEngine, request_from_window
from backends.stages.code2wav_service import Code2WavService
from backends.stages.factory import build_code2wav_engine
from voice_recording import assert_reference_feeds, expected_outputs, recording
from voice_onnx_models import export_voice_models


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = ensure_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0)
    models = export_voice_models(tmp_path_factory.mktemp("voice_models"))
    for name in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        shutil.copy(models / name, path / ASSET_SUBDIR / name)
    return path


@pytest.fixture(scope="module")
def service(checkpoint: Path) -> Code2WavService:
    return build_code2wav_engine({"checkpoint": str(checkpoint), "max_sessions": "2"})


def _run(engine: Code2WavEngine, request_id: str, ref: np.ndarray | None) -> np.ndarray:
    bridge = CodecWindowBridge()
    codes = np.random.default_rng(0).integers(0, 6561, 40).tolist()
    for window in bridge.push(codes) + bridge.end_turn():
        request = request_from_window(request_id, window)
        if ref is not None and window.chunk_seq == 0:
            request = Code2WavRequest(request.request_id, request.cache_epoch, request.chunk_seq,
                                      request.codes, request.num_left_context, request.last_chunk,
                                      ref_audio=ref)
        engine.submit(request)
    chunks = []
    while engine.num_pending():
        for result in engine.step():
            assert result.error is None, result.error
            chunks.append(result.audio)
    return np.concatenate(chunks)


def test_default_voice_comes_from_the_checkpoints_models(service, checkpoint, monkeypatch) -> None:
    """The voice prepared at load holds the models' outputs for HT_ref_audio.wav, fed as the
    reference feeds them (re-run here through recording sessions)."""
    token2wav = service.engine.token2wav
    assert isinstance(token2wav.voice_encoder, OnnxVoiceEncoder)
    spy = recording(token2wav.voice_encoder)
    monkeypatch.setattr(token2wav, "voice_encoder", spy)
    audio, rate = load_checkpoint(checkpoint).reference_voice()
    token2wav.voice_from_audio(torch.from_numpy(audio).float(), rate)
    assert_reference_feeds(spy, resample(torch.from_numpy(audio).float(), rate, 16000))
    codes, speaker = expected_outputs(spy)
    prompt = service.engine.voice.prompt
    assert torch.equal(prompt.codes, codes) and torch.equal(prompt.speaker, speaker)


def test_session_reference_goes_through_the_models(service, monkeypatch) -> None:
    engine = service.engine
    spy = recording(engine.token2wav.voice_encoder)
    monkeypatch.setattr(engine.token2wav, "voice_encoder", spy)
    ref = synthesize_reference_voice(11, 16000, 3.0).astype(np.float32)
    referenced = _run(engine, "ref", ref)
    assert len(spy.tokenizer.feeds) == 1 and len(spy.campplus.feeds) == 1
    assert_reference_feeds(spy, torch.from_numpy(ref))
    plain = _run(engine, "plain", None)
    assert len(spy.tokenizer.feeds) == 1  # the default voice was prepared at load
    assert np.abs(referenced - plain).max() > 1e-2
