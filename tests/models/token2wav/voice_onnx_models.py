"""Small ONNX models with the input/output signatures of the checkpoint's voice models, exported
by the tests with `torch.onnx.export` (random weights, a few kilobytes each).

- `speech_tokenizer_v2_25hz.onnx`: (feats [1, 128, T] float32, feats_length [1] int32) ->
  indices [1, ceil(T / 4)] int64. Like the real S3 tokenizer v2: frames past feats_length are
  masked, two stride-2 convolutions take 100 Hz frames to 25 Hz, and a projection to 8 values
  (standardised over the clip) quantised to 3 levels each gives one of 3^8 = 6561 codes
  (finite scalar quantisation).
- `campplus.onnx`: (input [1, F, 80] float32) -> output [1, 192] float32: a frame projection,
  mean and standard-deviation pooling over frames, an output projection.
Both depend on every input value, so a feed that differs anywhere changes their outputs.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from backends.models.token2wav.voice_assets import CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE

FSQ_DIMS = 8
FSQ_LEVELS = 3
SPEAKER_DIM = 192


class TinySpeechTokenizer(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(128, width, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.project = nn.Linear(width, FSQ_DIMS)
        self.register_buffer("place", FSQ_LEVELS ** torch.arange(FSQ_DIMS))

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        frames = torch.arange(feats.shape[2], device=feats.device)[None]
        mask = (frames < feats_length[:, None]).to(feats.dtype)  # [1, T]
        hidden = nn.functional.gelu(self.conv1(feats * mask[:, None]))
        hidden = nn.functional.gelu(self.conv2(hidden)).transpose(1, 2)  # [1, ceil(T / 4), width]
        projected = self.project(hidden)  # standardised over time, so all three levels occur
        centred = projected - projected.mean(dim=1, keepdim=True)
        projected = centred / (projected.std(dim=1, keepdim=True) + 1e-6)
        levels = torch.round(torch.tanh(projected)) + 1.0  # {0, 1, 2}
        return (levels.long() * self.place).sum(dim=-1)


class TinyCampplus(nn.Module):
    def __init__(self, width: int = 32, out_dim: int = SPEAKER_DIM) -> None:
        super().__init__()
        self.frame = nn.Linear(80, width)
        self.out = nn.Linear(2 * width, out_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.frame(features))  # [1, F, width]
        return self.out(torch.cat([hidden.mean(dim=1), hidden.std(dim=1)], dim=-1))


def export_voice_models(folder: Path, seed: int = 0, speaker_dim: int = SPEAKER_DIM) -> Path:
    """Write both models into `folder` (made if needed); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer, campplus = TinySpeechTokenizer().eval(), TinyCampplus(out_dim=speaker_dim).eval()
    frames = 64
    _export(tokenizer, (torch.zeros(1, 128, frames), torch.tensor([frames], dtype=torch.int32)),
            folder / SPEECH_TOKENIZER_FILE, ["feats", "feats_length"], ["indices"],
            {"feats": {2: "T"}, "indices": {1: "T4"}})
    _export(campplus, (torch.randn(1, frames, 80),), folder / CAMPPLUS_FILE, ["input"], ["output"],
            {"input": {1: "F"}})
    return folder


def _export(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path, inputs: list[str],
            outputs: list[str], dynamic_axes: dict[str, dict[int, str]]) -> None:
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic_axes, dynamo=False)
