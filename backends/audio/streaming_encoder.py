"""Per-session streaming audio encoding: each 1 s unit of 16 kHz audio -> exactly 10 embeddings.

One `StreamingAudioEncoder` per session, over a shared `AudioEncoderModel`. A unit goes through
`StreamingMel` (MiniCPM-o's "exact" mode, see backends/audio/streaming_mel.py: 102 mel frames
on the first chunk, 104 afterwards), then `WhisperEncoder.forward_chunk` with
prefix_extra_frames 0 on the first chunk and 2 afterwards and suffix_extra_frames 2 (one conv
frame cropped per redundant side leaves 50 encoder frames), the projector and the pool of 5.
The session's encoder KV cache restarts at position 0 when it would reach the position table
(the 30th unit, then every 29 units, with the real table of 1500); the mel window slides on
its own 30 s / 10 s schedule. Both are invisible to the caller: every unit yields 10 rows.

Choices where docs/model_facts.md leaves details open (kept simple and stated here):
- The unit framing (zero left pad to 1035 ms, 80-sample carry) follows the vllm-omni worker;
  the carry never forms a unit, so units never yield more or fewer than 10 rows.
- `encode_units` of k buffered units equals k calls of `encode_unit`: units are always encoded
  one by one, since the processor emits at most one chunk per unit.
- The reference voice follows the official `process_audio` + `get_audio_embedding`: every
  sample kept, each 30 s piece's mel as backends/audio/reference_mel.py computes it, then
  MiniCPM-o's non-streaming chunk mask (1 s = 50 encoder frames, `reference_chunk_frames`);
  the pieces' rows are concatenated. (The official batches several pieces with a zero-padded
  mel, which can move the last encoder frame of a shorter final piece by the conv's edge; each
  piece is encoded alone here.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from backends.audio.encoder_graphs import ChunkEncoderGraphs
from backends.audio.encoder_model import AudioEncoderModel
from backends.audio.reference_cache import ReferenceCache
from backends.audio.reference_mel import reference_mel, reference_pieces, reference_rows
from backends.audio.streaming_mel import StreamingMel, StreamingMelConfig
from backends.models.encoder_kv import EncoderKVCache
from backends.models.whisper_encoder import crop_redundancy
from backends.models.whisper_mel import WhisperMel
from backends.runner.host_staging import to_device

__all__ = ["AudioEncoderModel", "StreamingAudioConfig", "StreamingAudioEncoder"]

_CONV_STRIDE = 2  # mel frames per encoder frame


@dataclass(frozen=True, slots=True)
class StreamingAudioConfig:
    mel: StreamingMelConfig = field(default_factory=StreamingMelConfig)
    # MiniCPM-o's audio_chunk_length (1 s) in encoder frames; None = full attention
    reference_chunk_frames: int | None = 50

    @property
    def frames_per_unit(self) -> int:
        """Encoder frames of one unit's chunk after the redundancy crop (50 by default)."""
        return self.mel.chunk_frames // _CONV_STRIDE

    def __post_init__(self) -> None:
        if self.reference_chunk_frames is not None and self.reference_chunk_frames <= 0:
            raise ValueError(
                f"reference_chunk_frames must be positive or None, got "
                f"{self.reference_chunk_frames}"
            )


class StreamingAudioEncoder:
    """One session's audio state (mel window, encoder KV cache) over a shared model."""

    def __init__(self, model: AudioEncoderModel, config: StreamingAudioConfig | None = None,
                 graphs: ChunkEncoderGraphs | None = None,
                 references: ReferenceCache | None = None) -> None:
        """graphs: the shared graphed chunk pass (CUDA), used when its chunk length is ours;
        references: reference clips already encoded by any session of the engine."""
        self.references = references if references is not None else ReferenceCache(capacity=0)
        self.config = config or StreamingAudioConfig()
        self._model = model
        mel_config = self.config.mel
        frames_per_unit = self.config.frames_per_unit
        pool_step = model.audio_avg_pooler.step
        if mel_config.chunk_frames % _CONV_STRIDE or frames_per_unit % pool_step:
            raise ValueError(
                f"chunk_ms {mel_config.chunk_ms} does not give a whole number of embeddings "
                f"(pool step {pool_step})"
            )
        self.embeddings_per_unit = frames_per_unit // pool_step
        usable = (graphs is not None and graphs.model is model
                  and graphs.num_frames == frames_per_unit)
        self.graphs = graphs if usable else None
        self._whisper_mel = WhisperMel()
        self._mel = StreamingMel(mel_config, self._whisper_mel)
        self._cache: EncoderKVCache | None = None

    @property
    def unit_samples(self) -> int:
        return self.config.mel.chunk_samples

    @property
    def num_units(self) -> int:
        """Units encoded since the session start (or the last `reset`)."""
        return self._mel.num_chunks

    @property
    def cache_length(self) -> int:
        """Encoder frames held in the session's KV cache."""
        return 0 if self._cache is None else self._cache.length

    def reset(self) -> None:
        """Forget the stream (new session or epoch); the KV cache memory is kept for reuse."""
        self._mel.reset()
        if self._cache is not None:
            self._cache.length = 0

    @property
    def model(self) -> AudioEncoderModel:
        return self._model

    @torch.inference_mode()
    def encode_unit(self, samples: np.ndarray) -> torch.Tensor:
        """One unit ([16000] float32, 16 kHz mono) -> [10, llm_hidden] in the model dtype."""
        return self.encode_chunk(*self.take_unit(samples))

    @torch.inference_mode()
    def take_unit(self, samples: np.ndarray) -> tuple[torch.Tensor, int]:
        """The first half of `encode_unit`: advance the streaming mel by one unit ([16000]
        float32) and return its chunk ([80, frames] on the model device) and the chunk's left
        redundancy frames, for `encode_chunk` or the batched encode
        (backends/audio/batched_encoder.py)."""
        unit = _as_samples(samples)
        if unit.shape[0] != self.unit_samples:
            raise ValueError(f"a unit is {self.unit_samples} samples, got {unit.shape[0]}")
        prefix = self._mel.prefix_extra_frames
        chunk = self._mel.push_unit(unit).numpy()
        # queued without waiting for the GPU's work in flight (a blocking copy would)
        return to_device(chunk, self._model.apm.conv1.weight.device), prefix

    @torch.inference_mode()
    def encode_chunk(self, mel: torch.Tensor, prefix_extra_frames: int) -> torch.Tensor:
        """The second half of `encode_unit`: a chunk from `take_unit` -> [10, llm_hidden]."""
        if self.graphs is not None:
            return self._encode_graphed(mel, prefix_extra_frames)
        frames, self._cache = self._model.apm.forward_chunk(
            mel, self._cache, prefix_extra_frames=prefix_extra_frames,
            suffix_extra_frames=self.config.mel.redundancy_frames,
        )
        return self.check_rows(self._model.embed(frames))

    def _encode_graphed(self, mel: torch.Tensor, prefix_extra_frames: int) -> torch.Tensor:
        # `forward_chunk`'s work with the layers replayed from the shared graph
        assert self.graphs is not None
        conv = self._model.apm.conv_frames(mel[None])
        hidden = crop_redundancy(conv, prefix_extra_frames, self.config.mel.redundancy_frames)
        cache = self.claim_cache(conv.shape[1])
        return self.check_rows(self.graphs.encode(hidden, [cache])[0])

    def claim_cache(self, conv_frames: int) -> EncoderKVCache:
        """The KV cache the next chunk (`conv_frames` before the crop) writes to, after the
        restart rule at the position table; allocated on first use. For the batched encode."""
        self._cache = self._model.apm.cache_for(self._cache, conv_frames)
        return self._cache

    def check_rows(self, embeds: torch.Tensor) -> torch.Tensor:
        # The framing guarantees it; a failure here is a bug in the streaming arithmetic.
        assert embeds.shape[0] == self.embeddings_per_unit, embeds.shape
        return embeds

    def encode_units(self, samples: np.ndarray) -> torch.Tensor:
        """k buffered units ([k * 16000] float32) -> [10 * k, llm_hidden], equal to k calls of
        `encode_unit`."""
        units = _as_samples(samples)
        if units.shape[0] == 0 or units.shape[0] % self.unit_samples:
            raise ValueError(
                f"buffered audio must be a positive multiple of {self.unit_samples} samples, "
                f"got {units.shape[0]}"
            )
        pieces = units.split(self.unit_samples)
        return torch.cat([self.encode_unit(unit.numpy()) for unit in pieces])

    @torch.inference_mode()
    def encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        """A reference voice clip ([n] float32, 16 kHz) -> [rows, llm_hidden], non-streaming,
        every sample kept (`reference_rows` per 30 s piece); the session's streaming state is
        untouched."""
        return self.references.get_or_encode(samples, self._encode_reference)

    def _encode_reference(self, samples: np.ndarray) -> torch.Tensor:
        step = self._model.audio_avg_pooler.step
        pieces = [p for p in reference_pieces(_as_samples(samples))
                  if reference_rows(p.shape[0], step) > 0]
        if not pieces:
            weight = self._model.audio_projection_layer.linear2.weight
            return weight.new_zeros(0, self._model.llm_hidden_size)
        return torch.cat([self._encode_piece(piece) for piece in pieces])

    def _encode_piece(self, piece: torch.Tensor) -> torch.Tensor:
        # piece [n <= 480000] float32 -> [reference_rows(n), llm_hidden]
        apm = self._model.apm
        mel = reference_mel(self._whisper_mel, piece).to(apm.conv1.weight.device)
        frames = apm(mel[None], chunk_frames=self.config.reference_chunk_frames)
        return self._model.embed(frames[0])


def _as_samples(samples: np.ndarray) -> torch.Tensor:
    """Validate 16 kHz mono float32 samples; return them as a [n] float32 CPU tensor."""
    if not isinstance(samples, np.ndarray) or samples.ndim != 1 or samples.dtype != np.float32:
        shape = getattr(samples, "shape", None)
        raise ValueError(
            f"audio must be a 1-D float32 numpy array of 16 kHz samples, got "
            f"{type(samples).__name__} shape {shape} dtype {getattr(samples, 'dtype', None)}"
        )
    # a copy: callers may pass read-only or later-reused buffers (Triton input views)
    return torch.from_numpy(samples.copy())
