"""Recording sessions for the voice-path tests: an onnxruntime session that keeps every feed, and
the checks that an encoder's feeds are the reference's (`voice_reference`) and its prompt holds
the sessions' outputs."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import onnxruntime
import torch

from backends.models.token2wav.voice_onnx import OnnxVoiceEncoder
from voice_reference import reference_feeds

FEED_ATOL = 1e-5  # the same float32 ops in the same order; a framing or padding error is > 0.1
PROMPT_CODES = 150


class RecordingSession:
    """An onnxruntime session that keeps a copy of every feed it runs."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session = session
        self.feeds: list[list[np.ndarray]] = []
        self._lock = threading.Lock()

    def get_inputs(self) -> list[Any]:
        return self.session.get_inputs()

    def get_outputs(self) -> list[Any]:
        return self.session.get_outputs()

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        with self._lock:
            self.feeds.append([feed[i.name].copy() for i in self.session.get_inputs()])
        return self.session.run(names, feed)


def recording(encoder: OnnxVoiceEncoder) -> OnnxVoiceEncoder:
    return dataclasses.replace(encoder, tokenizer=RecordingSession(encoder.tokenizer),
                               campplus=RecordingSession(encoder.campplus))


def assert_reference_feeds(encoder: OnnxVoiceEncoder, clip_16k: torch.Tensor) -> None:
    """The encoder's last feeds are the reference's for this clip (the tokenizer's on the clip
    zero-padded to the prompt length)."""
    padded = torch.nn.functional.pad(clip_16k, (0, max(0, PROMPT_CODES * 640 - clip_16k.shape[0])))
    (mels, lens), _ = reference_feeds(padded)
    _, features = reference_feeds(clip_16k)
    tokenizer_feed, campplus_feed = encoder.tokenizer.feeds[-1], encoder.campplus.feeds[-1]
    assert tokenizer_feed[0].dtype == np.float32 and tokenizer_feed[1].dtype == np.int32
    assert tokenizer_feed[0].shape == mels.shape and np.array_equal(tokenizer_feed[1], lens)
    np.testing.assert_allclose(tokenizer_feed[0], mels, atol=FEED_ATOL, rtol=0)
    assert campplus_feed[0].dtype == np.float32 and campplus_feed[0].shape == features.shape
    np.testing.assert_allclose(campplus_feed[0], features, atol=FEED_ATOL, rtol=0)


def expected_outputs(encoder: OnnxVoiceEncoder) -> tuple[torch.Tensor, torch.Tensor]:
    """What the sessions return for the recorded feeds: (first 150 codes, speaker)."""
    tokenizer, campplus = encoder.tokenizer.session, encoder.campplus.session
    names = [i.name for i in tokenizer.get_inputs()]
    codes = tokenizer.run(None, dict(zip(names, encoder.tokenizer.feeds[-1], strict=True)))[0]
    speaker = campplus.run(None, {campplus.get_inputs()[0].name: encoder.campplus.feeds[-1][0]})[0]
    return torch.from_numpy(codes.reshape(-1)[:PROMPT_CODES]).long(), torch.from_numpy(speaker.reshape(-1))
