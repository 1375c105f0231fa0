"""The flow `CausalMaskedDiffWithXvec`: speech codes -> 80-bin mel at 2 frames per code.

Names follow the reference wrapper (docs/model_facts.md#code2wav-token2wav): `input_embedding`,
`spk_embed_affine_layer` (applied to the L2-normalised speaker), `encoder`, `encoder_proj`
(encoder features -> `mu`) and `decoder` (the CFM with its DiT `estimator`).

`setup_cache` runs a voice prompt (prompt codes + 3 look-ahead codes, prompt mel, speaker) and
keeps only the caches; `inference_chunk` decodes one window for a batch of streams with
cond = zeros; `inference` is the reference's whole-utterance path (prompt and codes in one
pass, cond = prompt mel), i.e. one final window over empty caches. The windowed calls take
projected speakers (`project_speaker`; `Token2Wav` keeps each stream's normalized speaker)
and host codes: the codes travel with the encoder's key masks in one copy, and embedding,
encoder and `encoder_proj` run as one fixed-shape pass (`run_encoder`, graphed on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from backends.models.token2wav.cfm import CausalConditionalCFM, EstimatorCache
from backends.models.token2wav.config import FlowConfig
from backends.models.token2wav.encoder import EncoderCache, UpsampleConformerEncoderV2
from backends.models.token2wav.encoder_packing import EncoderInputs, EncoderOutputs


@dataclass(slots=True)
class FlowCache:
    """One stream's flow state between windows."""

    encoder: EncoderCache
    estimator: EstimatorCache


@dataclass(frozen=True, slots=True)
class Encoded:
    """One window after the encoder: what the CFM takes, and how to grow the encoder caches
    (`grow_caches()`, once the CFM is queued: `UpsampleConformerEncoderV2.launch_chunk`)."""

    mu: torch.Tensor  # [R, 80, T_max]
    mel_frames: list[int]  # valid mel frames per row
    cond: torch.Tensor  # [R, 80, T_max]
    grow_caches: Callable[[], list[EncoderCache]]


class CausalMaskedDiffWithXvec(nn.Module):
    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        self.encoder = UpsampleConformerEncoderV2(config.input_size, config.encoder)
        self.encoder_proj = nn.Linear(config.encoder.output_size, config.output_size)
        self.decoder = CausalConditionalCFM(config.decoder)
        # what runs `run_encoder`: itself, or its CUDA-graph replays (`graphs.EncoderGraphs`)
        self.encoder_runner: Callable[[EncoderInputs], EncoderOutputs] = self.run_encoder
        self._zeros: torch.Tensor | None = None  # the last window's cond (see `_zero_cond`)

    def new_cache(self, device: torch.device | str) -> FlowCache:
        return FlowCache(self.encoder.new_cache(device), self.decoder.new_cache(device))

    def normalize_speaker(self, speakers: torch.Tensor) -> torch.Tensor:
        """speakers: [R, spk_embed_dim] -> unit length in the flow's dtype, row by row (each
        row's bits do not depend on the others: a stream keeps its own)."""
        return F.normalize(speakers, dim=1).to(self.spk_embed_affine_layer.weight.dtype)

    def project_speaker(self, speakers: torch.Tensor) -> torch.Tensor:
        """speakers: [R, spk_embed_dim] -> [R, 80]; only the direction of a speaker matters."""
        return self.spk_embed_affine_layer(self.normalize_speaker(speakers))

    def inference_chunk(
        self,
        codes: np.ndarray,  # [R, N_max] host codes in [0, vocab), any valid code past a row's end
        num_codes: list[int],
        last_chunk: list[bool],
        spks: torch.Tensor,  # [R, 80] projected speakers (`project_speaker`), the flow's dtype
        caches: list[FlowCache],
        prompt_mel: torch.Tensor | None = None,  # [R, N_max * 2, 80] cond, None -> zeros
    ) -> tuple[torch.Tensor, list[int], list[FlowCache]]:
        """-> (mel [R, 80, T_max] float32, valid mel frames per row, grown (unpruned) caches)."""
        encoded = self.encode(codes, num_codes, last_chunk, [c.encoder for c in caches],
                              prompt_mel)
        mel, estimator_caches = self.decoder.forward_chunk(
            encoded.mu, encoded.mel_frames, spks, encoded.cond,
            [c.estimator for c in caches],
        )
        grown = [FlowCache(e, d) for e, d in zip(encoded.grow_caches(), estimator_caches)]
        return mel, encoded.mel_frames, grown

    def encode(
        self,
        codes: np.ndarray,  # [R, N_max] host codes
        num_codes: list[int],
        last_chunk: list[bool],
        caches: list[EncoderCache],
        prompt_mel: torch.Tensor | None = None,  # [R, N_max * 2, 80] cond, None -> zeros
    ) -> Encoded:
        """The part of `inference_chunk` before the CFM: the CFM's inputs, the cache growth."""
        features, mel_frames, grow_caches = self.encoder.launch_chunk(
            codes, num_codes, last_chunk, caches, self.encoder_runner)
        mu = features.transpose(1, 2)  # [R, 80, T_max]
        if prompt_mel is None:
            return Encoded(mu, mel_frames, self._zero_cond(mu), grow_caches)
        cond = torch.zeros_like(mu)
        cond[:, :, : prompt_mel.shape[1]] = prompt_mel[:, : cond.shape[2]].transpose(1, 2)
        return Encoded(mu, mel_frames, cond, grow_caches)

    def run_encoder(self, inputs: EncoderInputs) -> EncoderOutputs:
        """`encoder.run` between the code embedding and `encoder_proj` (inputs.xs: int64 codes;
        features: [B, stride T, 80]): one fixed-shape pass, so one CUDA graph for all three."""
        outputs = self.encoder.run(replace(inputs, xs=self.input_embedding(inputs.xs)))
        return replace(outputs, features=self.encoder_proj(outputs.features))

    def _zero_cond(self, mu: torch.Tensor) -> torch.Tensor:
        """Zeros like `mu`, kept for the next window of its shape: nothing writes a window's
        cond (the CFM and its graphs only read it), so one tensor serves every window."""
        kept = self._zeros
        if torch.is_grad_enabled() or kept is None or kept.shape != mu.shape or (
                kept.dtype != mu.dtype or kept.device != mu.device):
            kept = torch.zeros(mu.shape, dtype=mu.dtype, device=mu.device)
            self._zeros = None if torch.is_grad_enabled() else kept
        return kept

    def setup_cache(
        self,
        codes: torch.Tensor,  # [P_tok + 3] int64 prompt codes + look-ahead codes
        prompt_mel: torch.Tensor,  # [2 P_tok, 80] float32
        speaker: torch.Tensor,  # [spk_embed_dim] float32
    ) -> FlowCache:
        """The caches after a voice prompt (its generated mel is discarded, as the reference's)."""
        frames = (codes.shape[0] - self.config.encoder.pre_lookahead_len) * 2
        if frames != prompt_mel.shape[0] or frames <= 0:
            raise ValueError(f"prompt mel has {prompt_mel.shape[0]} frames; {codes.shape[0]} "
                             f"codes with look-ahead need {frames}")
        _, _, (cache,) = self.inference_chunk(
            codes.cpu().numpy()[None], [codes.shape[0]], [False],
            self.project_speaker(speaker[None]), [self.new_cache(prompt_mel.device)], prompt_mel[None],
        )
        return cache

    def inference(
        self,
        codes: torch.Tensor,  # [N] int64
        prompt_codes: torch.Tensor,  # [P_tok] int64
        prompt_mel: torch.Tensor,  # [2 P_tok, 80] float32
        speaker: torch.Tensor,  # [spk_embed_dim] float32
    ) -> torch.Tensor:
        """Whole utterance: -> mel [80, 2 N] for `codes` after the prompt."""
        everything = torch.cat([prompt_codes, codes]).cpu().numpy()
        mel, _, _ = self.inference_chunk(
            everything[None], [everything.shape[0]], [True], self.project_speaker(speaker[None]),
            [self.new_cache(prompt_mel.device)], prompt_mel[None],
        )
        return mel[0, :, prompt_mel.shape[0] :]
