"""One streaming unit of each of many sessions through the audio tower in one batched forward.

`encode_units_batched` equals `StreamingAudioEncoder.encode_unit` per session (float32 on the
CPU: within ~1e-6 relative, the batched matmuls and the masked attention sum in another order)
and leaves every session's mel and KV cache state as the serial call would:
- The streaming mel runs per session (`take_unit`: host work on per-session state).
- Sessions sharing a model and a cropped chunk length form one batch (with the default framing
  every unit gives 50 frames after the crop, first units included). The conv stack runs once
  per distinct mel length within it (102 frames on a first unit, 104 afterwards), since zero
  padding a short chunk would change its conv frames.
- Each session applies its own cache restart rule (`claim_cache`); positions continue per
  session from its cache length. `BatchedKV` gathers the held keys/values of every session into
  one padded batch per layer, puts the chunk's keys at each row's own offset and masks keys past
  a row's end; the sessions' caches are written only once the whole forward and the projector
  have succeeded (`commit`).
- Projector and pool run on the batch; each session gets its [10, llm_hidden] rows.
Failures stay per session: a session whose mel step fails gets its exception, the others go on;
a batched forward that fails (nothing committed) is logged and its sessions are encoded one by
one from their mel chunks, each getting its rows or its own exception.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import numpy as np
import torch

from backends.audio.streaming_encoder import StreamingAudioEncoder
from backends.models.encoder_kv import EncoderKVCache
from backends.models.whisper_encoder import WhisperEncoder, crop_redundancy

logger = logging.getLogger(__name__)

Encoded = torch.Tensor | Exception  # a session's [10, llm_hidden] rows, or why it has none


@dataclass(frozen=True, slots=True)
class _Chunk:
    index: int  # in the caller's lists
    encoder: StreamingAudioEncoder
    mel: torch.Tensor  # [80, frames] on the model device
    prefix: int  # left redundancy mel frames

    @property
    def suffix(self) -> int:
        return self.encoder.config.mel.redundancy_frames

    @property
    def conv_frames(self) -> int:
        # the stride-2 conv (kernel 3, padding 1): [80, f] -> [(f - 1) // 2 + 1, d_model]
        return (self.mel.shape[1] - 1) // 2 + 1

    @property
    def core_frames(self) -> int:
        return self.conv_frames - (self.prefix + 1) // 2 - (self.suffix + 1) // 2

    def batch_key(self) -> tuple[int, int]:
        return id(self.encoder.model), self.core_frames

    def conv_key(self) -> tuple[int, int, int]:
        return self.mel.shape[1], self.prefix, self.suffix


def encode_units_batched(encoders: Sequence[StreamingAudioEncoder], units: Sequence[np.ndarray],
                         min_batch: int = 2) -> list[Encoded]:
    """One unit ([16000] float32) per session -> per session its [10, llm_hidden] rows (as
    `encode_unit` gives them) or the exception that ended its encode. Sessions must differ; a
    batch smaller than `min_batch` takes the serial path (the same work without the gather)."""
    if len(encoders) != len(units) or len({id(e) for e in encoders}) != len(encoders):
        raise ValueError("encode_units_batched takes one unit for each of distinct sessions")
    results: list[Encoded] = [RuntimeError("not encoded")] * len(encoders)
    chunks = []
    for index, (encoder, unit) in enumerate(zip(encoders, units)):
        try:
            chunks.append(_Chunk(index, encoder, *encoder.take_unit(unit)))
        except Exception as err:  # noqa: BLE001 - this session's failure, answered to it
            results[index] = err
    chunks.sort(key=lambda c: (c.batch_key(), c.conv_key()))
    for _, batch in groupby(chunks, key=_Chunk.batch_key):
        batch = list(batch)
        for chunk, encoded in zip(batch, _encode_batch(batch, min_batch)):
            results[chunk.index] = encoded
    return results


def _encode_batch(batch: list[_Chunk], min_batch: int) -> list[Encoded]:
    """Groups of at most the graphed pass's rows (all of them when eager), each committed or
    failed on its own."""
    graphs = batch[0].encoder.graphs
    size = graphs.max_rows if graphs is not None else len(batch)
    return [encoded for start in range(0, len(batch), size)
            for encoded in _encode_group(batch[start:start + size], min_batch)]


def _encode_group(group: list[_Chunk], min_batch: int) -> list[Encoded]:
    if len(group) >= min_batch:
        try:
            return list(_forward_batch(group).unbind(0))
        except Exception:  # noqa: BLE001 - nothing committed: the serial path answers each
            logger.exception("batched audio encode of %d sessions failed; encoding them one "
                             "by one", len(group))
    return [_encode_alone(chunk) for chunk in group]


def _encode_alone(chunk: _Chunk) -> Encoded:
    try:
        return chunk.encoder.encode_chunk(chunk.mel, chunk.prefix)
    except Exception as err:  # noqa: BLE001 - this session's failure, answered to it
        return err


@torch.inference_mode()
def _forward_batch(batch: list[_Chunk]) -> torch.Tensor:
    """Chunks of one model and one core length (sorted by conv key) -> [batch, 10, llm_hidden];
    commits every session's cache last."""
    model = batch[0].encoder.model
    apm = model.apm
    hidden = torch.cat([_conv(apm, list(group)) for _, group in groupby(batch, _Chunk.conv_key)])
    caches = [chunk.encoder.claim_cache(chunk.conv_frames) for chunk in batch]
    graphs = batch[0].encoder.graphs
    if graphs is not None:  # commits the caches once its pass has run
        return _checked(batch, graphs.encode(hidden, caches))
    store = BatchedKV(caches, hidden.shape[1])
    hidden = hidden + apm.embed_positions.weight[store.positions]
    embeds = _checked(batch, model.embed(apm.transform(hidden, store.mask, store)))
    store.commit()
    return embeds


def _checked(batch: list[_Chunk], embeds: torch.Tensor) -> torch.Tensor:
    for chunk, rows in zip(batch, embeds):
        chunk.encoder.check_rows(rows)
    return embeds


def _conv(apm: WhisperEncoder, group: list[_Chunk]) -> torch.Tensor:
    # chunks of one mel length and redundancy -> [len(group), core_frames, d_model]
    conv = apm.conv_frames(torch.stack([chunk.mel for chunk in group]))
    return crop_redundancy(conv, group[0].prefix, group[0].suffix)


class BatchedKV:
    """The KV caches of a batch of sessions, one chunk of `num_frames` each, as one padded batch.

    Row b holds session b's frames [0, start_b) and the chunk at [start_b, start_b + n); keys
    past start_b + n (stale or other rows' lengths) are masked out. Nothing is written to the
    sessions' caches until `commit`, which stores every layer's chunk keys/values at start_b
    and advances the lengths.
    """

    def __init__(self, caches: list[EncoderKVCache], num_frames: int) -> None:
        self.caches = caches
        self.num_frames = num_frames
        device = caches[0].keys.device
        starts = torch.tensor([cache.length for cache in caches], device=device)
        self.end = max(cache.length for cache in caches) + num_frames
        self.positions = starts[:, None] + torch.arange(num_frames, device=device)  # [B, n]
        self._rows = torch.arange(len(caches), device=device)[:, None].expand_as(self.positions)
        keys = torch.arange(self.end, device=device)
        # [B, 1, 1, end] bool, broadcast over heads and queries: True where a row may attend
        self.mask = (keys[None, :] < starts[:, None] + num_frames)[:, None, None, :]
        self._chunks: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's keys/values of `layer` ([B, heads, n, head_dim]) -> the padded batch of
        held + chunk, [B, heads, end, head_dim] each."""
        assert layer == len(self._chunks), (layer, len(self._chunks))  # one chunk, in order
        self._chunks.append((keys, values))
        return (self._padded([cache.keys[layer] for cache in self.caches], keys),
                self._padded([cache.values[layer] for cache in self.caches], values))

    def _padded(self, held: list[torch.Tensor], chunk: torch.Tensor) -> torch.Tensor:
        # held: per session [heads, max_source_positions, head_dim]; chunk [B, heads, n, hd]
        batch = torch.stack([rows[:, :self.end] for rows in held])
        batch[self._rows, :, self.positions] = chunk.transpose(1, 2)
        return batch

    def commit(self) -> None:
        """Write the chunk into every session's cache and advance its length."""
        keys = torch.stack([k for k, _ in self._chunks], dim=1)  # [B, layers, heads, n, hd]
        values = torch.stack([v for _, v in self._chunks], dim=1)
        for row, cache in enumerate(self.caches):
            span = slice(cache.length, cache.length + self.num_frames)
            cache.keys[:, :, span] = keys[row]
            cache.values[:, :, span] = values[row]
        for cache in self.caches:
            cache.length += self.num_frames
