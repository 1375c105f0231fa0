"""The real voice encoder: the checkpoint's S3 speech tokenizer v2 (25 Hz) and campplus, run with
onnxruntime, fed exactly what the reference feeds them.

- Tokenizer (`speech_tokenizer_v2_25hz.onnx`): inputs [1, 128, T] float32 (the clip's 128-bin
  Whisper log-mel, `s3_log_mel`) and [1] int32 (T); output the clip's codes, [1, ceil(T / 4)]
  integers (two stride-2 convolutions: 25 per second). The reference runs the same graph through
  the `s3tokenizer` package's torch port; its inputs are the same tensors.
- campplus (`campplus.onnx`): input [1, F, 80] float32, the clip's Kaldi fbank (`kaldi_fbank`)
  minus its mean over frames; output [1, 192] float32, the speaker embedding.
Inputs are bound by position, as the reference does, so the graphs' own names do not matter.

One session per model per process, made at load and reused for every voice. onnxruntime's
`InferenceSession.run` may be called from several threads at once, so no lock is needed. On a
CUDA stage the CUDA provider runs them when onnxruntime-gpu is installed (else the CPU one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from backends.models.token2wav.kaldi_fbank import KaldiFbank
from backends.models.token2wav.s3_log_mel import S3LogMel
from backends.models.token2wav.voice import SAMPLES_PER_CODE, pad_to_at_least

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def session_providers(device: torch.device) -> list[str | tuple[str, dict[str, int]]]:
    """The CUDA provider (on the stage's GPU) first when the stage runs on CUDA and the
    installed onnxruntime has it; the CPU provider always."""
    if device.type == "cuda" and CUDA_PROVIDER in onnxruntime.get_available_providers():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return [(CUDA_PROVIDER, {"device_id": index}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def open_session(path: Path, device: torch.device) -> onnxruntime.InferenceSession:
    """The reference's session options: full graph optimisation, one intra-op thread."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), sess_options=options,
                                        providers=session_providers(device))


@dataclass(frozen=True, slots=True)
class OnnxVoiceEncoder:
    tokenizer: onnxruntime.InferenceSession
    campplus: onnxruntime.InferenceSession
    vocab_size: int
    spk_embed_dim: int
    description: str = "the checkpoint's S3 tokenizer and campplus (onnxruntime)"
    mel: S3LogMel = field(default_factory=S3LogMel)
    fbank: KaldiFbank = field(default_factory=KaldiFbank)

    def __post_init__(self) -> None:
        _check_arity(self.tokenizer, 2, "the S3 tokenizer")
        _check_arity(self.campplus, 1, "campplus")

    def encode(self, audio_16k: torch.Tensor, num_codes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes of the clip zero-padded to at least `num_codes` codes, the first `num_codes`
        kept; the speaker of the clip as given."""
        codes = self.codes(pad_to_at_least(audio_16k, num_codes * SAMPLES_PER_CODE))
        if codes.shape[0] < num_codes:
            raise ValueError(f"the S3 tokenizer gave {codes.shape[0]} codes for "
                             f"{num_codes * SAMPLES_PER_CODE} samples, need {num_codes} (25 Hz)")
        return codes[:num_codes], self.speaker(audio_16k)

    def tokenizer_inputs(self, audio_16k: torch.Tensor) -> dict[str, np.ndarray]:
        mel = self.mel(audio_16k)[None]  # [1, 128, T]
        first, second = self.tokenizer.get_inputs()
        return {first.name: mel.numpy(), second.name: np.array([mel.shape[2]], dtype=np.int32)}

    def campplus_inputs(self, audio_16k: torch.Tensor) -> dict[str, np.ndarray]:
        features = self.fbank(audio_16k)
        features = features - features.mean(dim=0, keepdim=True)
        return {self.campplus.get_inputs()[0].name: features[None].numpy()}

    def codes(self, audio_16k: torch.Tensor) -> torch.Tensor:
        """[L] float32 at 16 kHz -> [ceil(L // 160 / 4)] int64 codes of the whole clip."""
        out = np.asarray(self.tokenizer.run(None, self.tokenizer_inputs(audio_16k))[0])
        if not np.issubdtype(out.dtype, np.integer):
            raise ValueError(f"the S3 tokenizer returned {out.dtype} values, expected integer codes")
        codes = torch.from_numpy(out.reshape(-1).astype(np.int64))
        if codes.numel() and not 0 <= int(codes.min()) <= int(codes.max()) < self.vocab_size:
            raise ValueError(f"the S3 tokenizer returned codes outside 0..{self.vocab_size - 1}")
        return codes

    def speaker(self, audio_16k: torch.Tensor) -> torch.Tensor:
        """[L] float32 at 16 kHz -> [spk_embed_dim] float32."""
        out = np.asarray(self.campplus.run(None, self.campplus_inputs(audio_16k))[0])
        speaker = torch.from_numpy(out.reshape(-1).astype(np.float32))
        if speaker.shape[0] != self.spk_embed_dim:
            raise ValueError(f"campplus returned {speaker.shape[0]} values, the flow needs "
                             f"{self.spk_embed_dim}")
        return speaker


def _check_arity(session: onnxruntime.InferenceSession, inputs: int, what: str) -> None:
    found = [f"{i.name} {i.type} {i.shape}" for i in session.get_inputs()]
    if len(found) != inputs or not session.get_outputs():
        raise ValueError(f"{what}: expected {inputs} input(s) and an output, found inputs {found}")
