"""Token2Wav: streaming codes -> 24 kHz audio for many streams at once.

A voice is prepared once (`prepare_voice`: the flow runs its prompt and keeps the caches); a
stream starts from its voice's caches and an empty HiFT state (`new_stream`, one per request and
turn). `decode` runs one flow forward over every window given (a ragged batch: each row keeps
its own caches and lengths), prunes each stream's caches, and runs the HiFT once per distinct
input length (in steady state every stream feeds 58 frames, so that is one call). Rows never
influence each other and each stream draws its source noise from its own generator, so
batching N streams gives what N separate calls give. With `enable_cache_pool` the streams'
DiT attention caches stay in one pooled tensor (`estimator_pool`) instead of being packed,
grown and cut by copies every window; the audio is the same.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from backends.models.speech_codes import SILENCE_CODE
from backends.models.token2wav.cache_pruning import prune_flow_cache
from backends.models.token2wav.cfm import EstimatorCache
from backends.models.token2wav.config import Token2WavConfig
from backends.models.token2wav.estimator_pool import EstimatorPool
from backends.models.token2wav.flow import CausalMaskedDiffWithXvec, FlowCache
from backends.models.token2wav.graphs import (
    DEFAULT_MAX_GRAPHS,
    EncoderGraphs,
    HiFTGraphs,
    PooledSolverGraphs,
    SolverGraphs,
    graph_counts,
)
from backends.models.token2wav.hift import HiFTGenerator
from backends.models.token2wav.stream import Token2WavStream, emit_rows, flush, to_host
from backends.models.token2wav.stream_window import StreamWindow, validate_windows
from backends.models.token2wav.voice import VoiceEncoder, VoicePrompt, build_voice_prompt
from backends.models.token2wav.voice_standin import StandinVoiceEncoder


@dataclass(frozen=True, slots=True)
class Voice:
    """A prepared voice: its prompt and the flow caches after it (shared by its streams)."""

    prompt: VoicePrompt
    cache: FlowCache


class Token2Wav(nn.Module):
    def __init__(self, config: Token2WavConfig) -> None:
        super().__init__()
        self.config = config
        self.flow = CausalMaskedDiffWithXvec(config.flow)
        self.hift = HiFTGenerator(config.hift)
        self._hift_graphs: HiFTGraphs | None = None
        self._max_graphs = 0  # of the pooled solve, set by enable_cuda_graphs
        self._pool: EstimatorPool | None = None  # see enable_cache_pool
        # codes and speaker of a voice's prompt: `load_token2wav` sets the checkpoint's
        # (voice_assets); random weights keep the stand-ins
        self.voice_encoder: VoiceEncoder = StandinVoiceEncoder(config.flow.vocab_size,
                                                               config.flow.spk_embed_dim)

    def enable_cuda_graphs(self, max_graphs: int = DEFAULT_MAX_GRAPHS, encoder: bool = True) -> None:
        """Replay the conformer encoder (unless `encoder` is False), the CFM solve and the HiFT
        (up to its ISTFT) from CUDA graphs, captured per shape bucket on first use; a no-op on
        CPU (the same code runs eagerly)."""
        flow = self.flow
        flow.encoder_runner = (EncoderGraphs(flow.encoder, max_graphs, flow.run_encoder) if encoder
                               else flow.run_encoder)
        flow.decoder.solver = SolverGraphs(flow.decoder, max_graphs)
        self._hift_graphs = HiFTGraphs(self.hift, max_graphs)
        self._max_graphs = max_graphs
        self._set_pool_solver()

    def disable_cuda_graphs(self) -> None:
        self.flow.encoder_runner = self.flow.run_encoder
        self.flow.decoder.solver = self.flow.decoder.solve
        self._hift_graphs = None
        self._max_graphs = 0
        self._set_pool_solver()

    def enable_cache_pool(self, max_streams: int, capacity: int | None = None) -> None:
        """Keep the DiT attention caches of up to `max_streams` live streams in one pooled
        tensor (`estimator_pool`: no per-window packing, growing or cutting copies). Streams
        made afterwards take a slot each (`new_stream` raises CachePoolFullError when none is
        free) until they finish, are released (`release_stream`) or are dropped. capacity:
        cache frames per stream, default the configured prompt + cache_keep_frames. Call it
        after moving the model and setting its flow dtype; streams made before it stay
        unusable (decode rejects them)."""
        config = self.config
        if capacity is None:
            capacity = round(config.prompt_seconds * self.sample_rate / config.hift.hop_samples)
            capacity += config.cache_keep_frames
        self._pool = EstimatorPool(self.flow.decoder, max_streams, capacity,
                                   config.cache_keep_frames)
        self._set_pool_solver()

    def disable_cache_pool(self) -> None:
        """Back to per-stream caches (streams holding slots are rejected from now on)."""
        self._pool = None

    def _set_pool_solver(self) -> None:
        pool, cfm = self._pool, self.flow.decoder
        if pool is not None and self._max_graphs:
            pool.solver = PooledSolverGraphs(cfm, pool.att, pool.zero_position, self._max_graphs)
        elif pool is not None:
            pool.solver = lambda inputs: cfm.solve_pooled(inputs, pool.att)

    @property
    def cache_pool(self) -> EstimatorPool | None:
        return self._pool

    def release_stream(self, stream: Token2WavStream) -> None:
        """Give the stream's pooled cache slot back (idempotent; a no-op without the pool).
        The stream takes no more windows."""
        if stream.cache_slot is not None and self._pool is not None:
            self._pool.release(stream.cache_slot)

    def seal_hift_graphs(self) -> None:
        """After the warm-up: the HiFT keeps its graphs but captures no new mel length (a final
        window's length is one of ~25, each run eagerly in a few ms instead of a capture)."""
        if self._hift_graphs is not None:
            self._hift_graphs.runner.seal()

    def graph_counts(self) -> dict[str, int]:
        """Graphs captured and eager CUDA calls (`graphs.graph_counts`) of every graphed part."""
        return graph_counts(self.flow.encoder_runner, self.flow.decoder.solver,
                            self._pool and self._pool.solver, self._hift_graphs)

    def set_fused_kernels(self, enabled: bool | None = None) -> None:
        """The fused kernels of the DiT (`dit_fused`), HiFT (`snake_kernel`) and encoder
        attention (`conformer_fused`): None (default) on CUDA only, False never (the torch
        reference path), True on any device (CPU: Triton's under its interpreter, tests)."""
        self.flow.decoder.estimator.fused = enabled
        self.hift.fused = enabled
        self.flow.encoder.set_fused_attention(enabled)

    def set_flow_dtype(self, dtype: torch.dtype) -> None:
        """Run the flow (weights, caches, noise) in `dtype`, e.g. bfloat16 on GPU, like the
        reference's `float16=True`; the HiFT stays float32. Prepare voices afterwards."""
        self.flow.to(dtype)

    @property
    def device(self) -> torch.device:
        return self.flow.input_embedding.weight.device

    @property
    def sample_rate(self) -> int:
        return self.config.hift.sampling_rate

    def voice_from_audio(self, audio: torch.Tensor, sample_rate: int) -> Voice:
        """audio: [L] float32 mono reference voice -> a prepared voice (see `voice`)."""
        prompt = build_voice_prompt(audio, sample_rate, self.config.prompt_seconds, self.voice_encoder)
        return self.prepare_voice(prompt)

    @torch.inference_mode()
    def prepare_voice(self, prompt: VoicePrompt) -> Voice:
        """Run the prompt codes plus 3 silence look-ahead codes (the reference's setup).

        Always eager, also once CUDA graphs are on: the one-off prompt pass of a voice prepared
        while serving (a session's reference) must not capture a graph of its own."""
        lookahead = torch.full((self.config.flow.encoder.pre_lookahead_len,), SILENCE_CODE)
        codes = torch.cat([prompt.codes.cpu(), lookahead])  # host codes: the flow copies them
        flow, decoder = self.flow, self.flow.decoder
        solver, decoder.solver = decoder.solver, decoder.solve
        runner, flow.encoder_runner = flow.encoder_runner, flow.run_encoder
        try:
            cache = flow.setup_cache(codes, prompt.mel.to(self.device), prompt.speaker.to(self.device))
        finally:
            decoder.solver, flow.encoder_runner = solver, runner
        return Voice(prompt, cache)

    def new_stream(self, voice: Voice, seed: int = 0) -> Token2WavStream:
        """A stream from `voice`'s caches; `seed` fixes its source-noise sequence."""
        device = self.device
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.inference_mode():  # once per stream, not per window
            speaker = self.flow.normalize_speaker(voice.prompt.speaker.to(device)[None])[0]
        stream = Token2WavStream(
            speaker=speaker,
            prompt_frames=voice.prompt.num_mel_frames,
            flow_cache=voice.cache,
            generator=generator,
            mel_cache=torch.zeros(self.config.flow.output_size, 0, device=device),
            source_cache=torch.zeros(0, device=device),
            speech_tail=torch.zeros(0, device=device),
        )
        if self._pool is not None:
            att = voice.cache.estimator.att
            stream.cache_slot = self._pool.acquire(att, stream.prompt_frames)
            stream.flow_cache = FlowCache(voice.cache.encoder, EstimatorCache(
                att[:, :, :, :, :0], voice.cache.estimator.cnn))
            weakref.finalize(stream, self._pool.release, stream.cache_slot)
        return stream

    @torch.inference_mode()
    def decode(self, windows: list[StreamWindow]) -> list[np.ndarray]:
        """Decode one window per stream (each stream at most once) -> [samples] float32 each.

        Updates every stream's state; raises ValueError for a malformed window."""
        validate_windows(windows, self.config, self._pool)
        coded = [i for i, w in enumerate(windows) if len(w.codes)]
        decoded, settle = self._decode_coded([windows[i] for i in coded]) if coded else ([], lambda: None)
        audio = dict(zip(coded, decoded))

        def housekeeping() -> None:  # device work queued behind the audio's copy to the host
            settle()
            for window in (w for w in windows if w.last_chunk):
                self.release_stream(window.stream)

        rows = [audio[i] if i in audio else flush(w.stream) for i, w in enumerate(windows)]
        return to_host(rows, before_wait=housekeeping)

    def _decode_coded(self, windows: list[StreamWindow]
                      ) -> tuple[list[torch.Tensor], Callable[[], None]]:
        """-> (audio per window, `settle`: grows and prunes the flow caches; call it once,
        after the audio's work is queued and before these streams decode again)."""
        mel, mel_frames, settle = self._run_flow(windows)
        hift_inputs = [
            torch.cat([w.stream.mel_cache, mel[b, :, : mel_frames[b]].float()], dim=1)
            for b, w in enumerate(windows)
        ]
        # one HiFT call per (frames, cached source) shape: in steady state that is every row
        by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
        for b, (mel_in, window) in enumerate(zip(hift_inputs, windows)):
            by_shape[mel_in.shape[1], window.stream.source_cache.shape[0]].append(b)
        out: list[torch.Tensor] = [torch.zeros(0)] * len(windows)
        vocode = self._hift_graphs or self.hift
        for (frames, _), rows in by_shape.items():
            streams = [windows[b].stream for b in rows]
            mel_rows = torch.stack([hift_inputs[b] for b in rows])
            speech, source = vocode(
                mel_rows,
                [s.source_cache for s in streams],
                torch.stack([self._source_noise(s, frames) for s in streams]),
            )
            emitted = emit_rows(streams, mel_rows, speech, source,
                                [windows[b].last_chunk for b in rows],
                                self.config.mel_cache_frames)
            for b, samples in zip(rows, emitted):
                out[b] = samples
        return out, settle

    def _source_noise(self, stream: Token2WavStream, frames: int) -> torch.Tensor:
        """[480 frames, nb_harmonics + 1] standard normal from the stream's own generator."""
        shape = (frames * self.config.hift.hop_samples, self.hift.num_noise_channels())
        return torch.randn(shape, generator=stream.generator, device=self.device)

    def _run_flow(self, windows: list[StreamWindow]
                  ) -> tuple[torch.Tensor, list[int], Callable[[], None]]:
        """-> (mel [B, 80, T_max], valid mel frames per row, `settle`). `settle()` updates and
        prunes the streams' flow caches: tens of small ops for a batch, so the caller queues
        them after the window's solve and vocoder instead of before."""
        num_codes = [len(w.codes) for w in windows]
        codes = np.zeros((len(windows), max(num_codes)), dtype=np.int64)
        for b, window in enumerate(windows):
            codes[b, : num_codes[b]] = window.codes
        args = (codes, num_codes, [w.last_chunk for w in windows])  # codes go with the masks
        if self._pool is None:
            mel, mel_frames, grown = self.flow.inference_chunk(
                *args, self._project_speakers(windows), [w.stream.flow_cache for w in windows])
            caches: Callable[[], list[FlowCache]] = lambda: grown  # noqa: E731
        else:
            mel, mel_frames, caches = self._run_pooled_flow(windows, *args)
        keep = self.config.cache_keep_frames

        def settle() -> None:
            for window, cache in zip(windows, caches()):
                window.stream.flow_cache = prune_flow_cache(cache, window.stream.prompt_frames, keep)

        return mel, mel_frames, settle

    def _project_speakers(self, windows: list[StreamWindow]) -> torch.Tensor:
        """-> [R, 80]. The linear stays per window: its rows' last bits depend on the batch
        size, so projecting per stream would move batched audio."""
        return self.flow.spk_embed_affine_layer(torch.stack([w.stream.speaker for w in windows]))

    def _run_pooled_flow(self, windows: list[StreamWindow], codes: np.ndarray,
                         num_codes: list[int], last_chunk: list[bool],
                         ) -> tuple[torch.Tensor, list[int], Callable[[], list[FlowCache]]]:
        """`flow.inference_chunk` with the DiT caches in the pool (already cut there); the grown
        caches come from the returned callable (deferred, as the encoder's)."""
        assert self._pool is not None
        flow_caches = [w.stream.flow_cache for w in windows]
        encoded = self.flow.encode(codes, num_codes, last_chunk, [c.encoder for c in flow_caches])
        mel, cnn = self._pool.forward_chunk(  # the speakers after the encoder's launch
            self.flow.decoder, encoded.mu, encoded.mel_frames, self._project_speakers(windows),
            encoded.cond,
            [w.stream.cache_slot for w in windows], [c.estimator.cnn for c in flow_caches])

        def caches() -> list[FlowCache]:
            return [FlowCache(encoder, EstimatorCache(old.estimator.att, new_cnn))
                    for encoder, old, new_cnn in zip(encoded.grow_caches(), flow_caches, cnn)]

        return mel, encoded.mel_frames, caches
