"""Token2Wav: streaming codes -> 24 kHz audio for many streams at once.

`decode` runs one flow forward over every window given (a ragged batch: each row keeps its own
caches and lengths) and then the HiFT once per distinct input length (in steady state every
stream feeds 58 frames, so that is one call). Rows never influence each other: batching N
streams gives what N separate calls give.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from backends.models.token2wav.config import Token2WavConfig
from backends.models.token2wav.flow import CausalMaskedDiffWithXvec
from backends.models.token2wav.hift import HiFTGenerator
from backends.models.token2wav.stream import Token2WavStream, emit, flush


@dataclass(frozen=True, slots=True)
class StreamWindow:
    """One window of one stream for `Token2Wav.decode`."""

    stream: Token2WavStream
    codes: np.ndarray  # [n] int32 codes in [0, vocab_size); empty only when last_chunk
    last_chunk: bool


class Token2Wav(nn.Module):
    def __init__(self, config: Token2WavConfig) -> None:
        super().__init__()
        self.config = config
        self.flow = CausalMaskedDiffWithXvec(config.flow)
        self.hift = HiFTGenerator(config.hift)

    @property
    def device(self) -> torch.device:
        return self.flow.input_embedding.weight.device

    @property
    def sample_rate(self) -> int:
        return self.config.hift.sampling_rate

    def default_speaker(self) -> torch.Tensor:
        """[spk_embed_dim] float32: a fixed voice until reference-audio speaker embeddings
        (campplus) exist; only its direction matters (the flow L2-normalises it)."""
        return torch.ones(self.config.flow.spk_embed_dim, device=self.device)

    def new_stream(self, speaker: torch.Tensor | None = None) -> Token2WavStream:
        """speaker: [spk_embed_dim] float32 or None for the default voice."""
        device = self.device
        spk = self.default_speaker() if speaker is None else speaker.to(device, torch.float32)
        if spk.shape != (self.config.flow.spk_embed_dim,):
            raise ValueError(
                f"speaker must be [{self.config.flow.spk_embed_dim}], got {tuple(spk.shape)}"
            )
        return Token2WavStream(
            speaker=spk,
            encoder_cache=self.flow.new_cache(device),
            mel_cache=torch.zeros(self.config.flow.output_size, 0, device=device),
            source_cache=torch.zeros(0, device=device),
            speech_tail=torch.zeros(0, device=device),
        )

    @torch.inference_mode()
    def decode(self, windows: list[StreamWindow]) -> list[np.ndarray]:
        """Decode one window per stream (each stream at most once) -> [samples] float32 each.

        Updates every stream's state; raises ValueError for a malformed window."""
        self._validate(windows)
        coded = [i for i, w in enumerate(windows) if len(w.codes)]
        decoded = self._decode_coded([windows[i] for i in coded]) if coded else []
        audio = dict(zip(coded, decoded))
        return [
            (audio[i] if i in audio else flush(w.stream)).float().cpu().numpy()
            for i, w in enumerate(windows)
        ]

    def _validate(self, windows: list[StreamWindow]) -> None:
        lookahead = self.config.flow.encoder.pre_lookahead_len
        vocab = self.config.flow.vocab_size
        if len({id(w.stream) for w in windows}) != len(windows):
            raise ValueError("a stream may appear only once per decode")
        for window in windows:
            if window.stream.is_finished:
                raise ValueError("stream already finished by a final window")
            if not window.last_chunk and len(window.codes) <= lookahead:
                raise ValueError(
                    f"chunk_below_lookahead_window: a non-final window needs more than "
                    f"{lookahead} codes, got {len(window.codes)}"
                )
            if len(window.codes) and not (0 <= window.codes.min() and window.codes.max() < vocab):
                raise ValueError(f"codes must lie in [0, {vocab}), got {window.codes.tolist()}")

    def _decode_coded(self, windows: list[StreamWindow]) -> list[torch.Tensor]:
        mel, mel_frames = self._run_flow(windows)
        hift_inputs = [
            torch.cat([w.stream.mel_cache, mel[b, :, : mel_frames[b]]], dim=1)
            for b, w in enumerate(windows)
        ]
        by_length: dict[int, list[int]] = defaultdict(list)
        for b, frames in enumerate(hift_inputs):
            by_length[frames.shape[1]].append(b)
        out: list[torch.Tensor] = [torch.zeros(0)] * len(windows)
        for rows in by_length.values():
            speech, source = self.hift(
                torch.stack([hift_inputs[b] for b in rows]),
                [windows[b].stream.source_cache for b in rows],
            )
            for j, b in enumerate(rows):
                out[b] = emit(
                    windows[b].stream, hift_inputs[b], speech[j], source[j],
                    windows[b].last_chunk, self.config.mel_cache_frames,
                )
        return out

    def _run_flow(self, windows: list[StreamWindow]) -> tuple[torch.Tensor, list[int]]:
        """-> (mel [B, 80, T_max], valid mel frames per row); updates encoder caches."""
        num_codes = [len(w.codes) for w in windows]
        codes = torch.zeros(len(windows), max(num_codes), dtype=torch.int64)
        for b, window in enumerate(windows):
            codes[b, : num_codes[b]] = torch.from_numpy(window.codes.astype(np.int64))
        mel, mel_frames, caches = self.flow.inference_chunk(
            codes.to(self.device),
            num_codes,
            [w.last_chunk for w in windows],
            torch.stack([w.stream.speaker for w in windows]),
            [w.stream.encoder_cache for w in windows],
        )
        for window, cache in zip(windows, caches):
            window.stream.encoder_cache = cache
        return mel, mel_frames
