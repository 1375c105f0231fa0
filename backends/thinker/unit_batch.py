"""The Thinker engine's batched audio encode: the one-unit appends of every session that
activates in a step go through the audio tower in one forward (backends/audio/batched_encoder.py)
instead of one encoder pass per session.

Still encoded one session at a time, by `ThinkerSession.activate`: appends of several units
(buffered audio), sessions whose encoder is not a `StreamingAudioEncoder` (test fakes), a step
where a single session activates (the batch would be the same work plus a cache gather), and
the reference audio of a session's first append (`ThinkerSession.setup`, at submit time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from backends.audio.batched_encoder import Encoded, encode_units_batched
from backends.audio.encoder_graphs import ChunkEncoderGraphs
from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.reference_cache import ReferenceCache
from backends.audio.streaming_encoder import StreamingAudioConfig, StreamingAudioEncoder
from backends.thinker.session_state import ThinkerSession, UnitEncoder

__all__ = ["Encoded", "encode_pending_units", "streaming_encoder_factory"]

MIN_BATCH = 2  # fewer activating sessions keep the serial path


def encode_pending_units(sessions: Iterable[ThinkerSession]) -> dict[str, Encoded]:
    """request id -> the rows ([10, hidden]) of the one-unit append the session activates next,
    or the error of its encode (raised for it alone by `activate`). Sessions left out encode
    their append themselves. Never raises for one session's failure."""
    picked = []
    for session in sessions:
        unit = session.pending_unit()
        if unit is not None and isinstance(session.encoder, StreamingAudioEncoder):
            picked.append((session, unit))
    if len(picked) < MIN_BATCH:
        return {}
    encoders = [session.encoder for session, _ in picked]
    encoded = encode_units_batched(encoders, [unit for _, unit in picked])  # type: ignore[misc]
    return {session.request_id: rows for (session, _), rows in zip(picked, encoded)}


def streaming_encoder_factory(audio_encoder_model: AudioEncoderModel | None) -> Callable[[], UnitEncoder]:
    """A new session's encoder: its own streaming state over the shared audio tower (on CUDA
    its chunk passes replay graphs over key buckets, through the split-key Triton kernel)."""
    if audio_encoder_model is None:
        raise ValueError("ThinkerEngine needs an audio_encoder_model or an encoder_factory")
    audio_encoder_model.apm.pack_projections()  # loaded and on its device by now
    graphs = None
    if audio_encoder_model.apm.conv1.weight.device.type == "cuda":
        graphs = ChunkEncoderGraphs(audio_encoder_model, StreamingAudioConfig().frames_per_unit)
        graphs.capture_all()  # at load: a capture mid-reply stalls the Thinker's thread
    references = ReferenceCache()  # one per engine: sessions share encoded reference voices
    return lambda: StreamingAudioEncoder(audio_encoder_model, graphs=graphs, references=references)
