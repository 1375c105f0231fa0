"""The encoder's per-stream state and its packing around the fixed-shape `run`.

`UpsampleConformerEncoderV2.forward_chunk` = `pack_encoder_inputs` (host lists -> padded
tensors and key masks) -> `run` (tensors only: CUDA-graph capturable, like the CFM's `solve`)
-> `unpack_encoder_outputs` (per-row cache cuts and growth, deferred until asked for).
The window comes as code embeddings (a device tensor) or as the codes themselves (a host
array: padded on the host and copied with the key masks in one copy, for a `run` that embeds
them, `CausalMaskedDiffWithXvec.run_encoder`).
`pad_encoder_inputs` widens a packed window to a graph's shape bucket: more window frames
after every row's last one and more cache slots before every row's first one (the Conformer's
caches are left-padded, so relative distances stay aligned), all masked, so no real frame
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from backends.models.token2wav.batching import key_masks, left_pad, take_frames
from backends.models.token2wav.config import EncoderConfig
from backends.runner.host_staging import to_device_packed

CONV2_CONTEXT = 2  # the pre-lookahead conv2 has kernel 3: 2 frames of left context


@dataclass(slots=True)
class EncoderCache:
    """One stream's encoder state between windows (time axes oldest first)."""

    lookahead: torch.Tensor  # [d, 2] float32: the last two conv1 outputs (conv2's context)
    upsample: torch.Tensor  # [d, 2 stride] float32: the last up-sampled frames
    token_kv: torch.Tensor  # [num_blocks, H, T1, 2 dk] float32 token-rate keys | values
    mel_kv: torch.Tensor  # [num_up_blocks, H, L, 2 dk] float32 mel-rate keys | values


@dataclass(frozen=True, slots=True)
class EncoderInputs:
    """One window of B streams: T code frames (T + lookahead embeddings), padded caches."""

    xs: torch.Tensor  # [B, T + lookahead, d] code embeddings, or [B, T + lookahead] int64 codes
    code_valid: torch.Tensor  # [B, T + lookahead] bool: False past a row's codes
    lookahead: torch.Tensor  # [B, d, 2]
    upsample: torch.Tensor  # [B, d, 2 stride]
    token_kv: torch.Tensor  # [B, num_blocks, H, C1, 2 dk] left-padded
    token_valid: torch.Tensor  # [B, C1 + T] bool over [cache | window]
    mel_kv: torch.Tensor  # [B, num_up_blocks, H, C2, 2 dk] left-padded
    mel_valid: torch.Tensor  # [B, C2 + stride T] bool


@dataclass(frozen=True, slots=True)
class EncoderOutputs:
    features: torch.Tensor  # [B, stride T, d] mel-rate features (d = 80 once projected)
    conv2_in: torch.Tensor  # [B, d, 2 + T] conv2's input with its context
    up_in: torch.Tensor  # [B, d, 2 stride + stride T] the up-sampling conv's input
    token_kv: torch.Tensor  # [B, num_blocks, H, T, 2 dk] this window's keys | values
    mel_kv: torch.Tensor  # [B, num_up_blocks, H, stride T, 2 dk]


# (frames, token-rate cache, mel-rate cache) of a window -> the sizes to pack it at (>= each)
PadSizes = Callable[[int, int, int], tuple[int, int, int]]


def pack_encoder_inputs(
    config: EncoderConfig,
    xs: torch.Tensor | np.ndarray,  # [B, N_max, d] code embeddings, or [B, N_max] host codes
    num_codes: list[int],
    last_chunk: list[bool],
    caches: list[EncoderCache],
    pad_to: PadSizes | None = None,
) -> tuple[EncoderInputs, list[int]]:
    """-> (the window's tensors, code frames per row: N - lookahead, or N for a final row).
    With `pad_to` (a graph's shape buckets) the window is packed at those sizes at once, as
    `pad_encoder_inputs` would widen it: one copy of the caches and masks, not two."""
    lookahead, stride = config.pre_lookahead_len, config.up_stride
    num_frames = [n - lookahead * (not last) for n, last in zip(num_codes, last_chunk)]
    if min(num_frames) < 1:
        raise ValueError(f"every non-final window needs more than {lookahead} codes, "
                         f"got {num_codes}")
    token_lens = [c.token_kv.shape[2] for c in caches]
    mel_lens = [c.mel_kv.shape[2] for c in caches]
    frames, token_len, mel_len = max(num_frames), max(token_lens), max(mel_lens)
    if pad_to is not None:
        frames, token_len, mel_len = pad_to(frames, token_len, mel_len)
    length = frames + lookahead
    masks = key_masks([
        ([0] * len(caches), 0, num_codes, length),  # codes: a window part without cache
        (token_lens, token_len, num_frames, frames),
        (mel_lens, mel_len, [stride * n for n in num_frames], stride * frames),
    ])
    device = caches[0].lookahead.device
    if isinstance(xs, np.ndarray):  # codes: padded with code 0 (masked), one copy with the masks
        codes = np.zeros((len(caches), length), dtype=np.int64)
        codes[:, : min(length, xs.shape[1])] = xs[:, :length]
        xs, code_valid, token_valid, mel_valid = to_device_packed([codes, *masks], device)
    else:
        if xs.shape[1] != length:
            xs = F.pad(xs, (0, 0, 0, max(0, length - xs.shape[1])))[:, :length]
        code_valid, token_valid, mel_valid = to_device_packed(masks, device)
    return EncoderInputs(
        xs=xs, code_valid=code_valid,
        lookahead=torch.stack([c.lookahead for c in caches]),
        upsample=torch.stack([c.upsample for c in caches]),
        token_kv=left_pad([c.token_kv for c in caches], dim=2, length=token_len),
        token_valid=token_valid,
        mel_kv=left_pad([c.mel_kv for c in caches], dim=2, length=mel_len),
        mel_valid=mel_valid,
    ), num_frames


def unpack_encoder_outputs(
    outputs: EncoderOutputs, num_frames: list[int], stride: int, caches: list[EncoderCache]
) -> tuple[torch.Tensor, list[int], Callable[[], list[EncoderCache]]]:
    """-> (features, mel frames per row, `grow`: returns the grown caches, old frames then
    this window's). Deferred: the caller queues the window's solve first, then the per-row
    cache copies (a few small ops per row). `outputs` may be a graph's: `grow` must run before
    that graph replays again."""
    mel_frames = [stride * n for n in num_frames]

    def grow() -> list[EncoderCache]:
        return [
            EncoderCache(
                lookahead=take_frames(outputs.conv2_in[b], n, CONV2_CONTEXT),
                upsample=take_frames(outputs.up_in[b], m, 2 * stride),
                token_kv=torch.cat([cache.token_kv, outputs.token_kv[b, :, :, :n]], dim=2),
                mel_kv=torch.cat([cache.mel_kv, outputs.mel_kv[b, :, :, :m]], dim=2),
            )
            for b, (n, m, cache) in enumerate(zip(num_frames, mel_frames, caches))
        ]

    # a window packed at a graph's bucket comes back that wide: cut to its real frames, so the
    # CFM pads it with zeros to its own bucket as an unpadded window
    features = outputs.features
    if features.shape[1] != max(mel_frames):
        features = features[:, : max(mel_frames)]
    return features, mel_frames, grow


def pad_encoder_inputs(inputs: EncoderInputs, frames: int, token_cached: int,
                       mel_cached: int) -> EncoderInputs:
    """Widen to `frames` code frames and the given cache lengths (all new slots masked)."""
    extra = frames - (inputs.token_valid.shape[1] - inputs.token_kv.shape[3])
    extra_token = token_cached - inputs.token_kv.shape[3]
    extra_mel = mel_cached - inputs.mel_kv.shape[3]
    stride = (inputs.mel_valid.shape[1] - inputs.mel_kv.shape[3]) // (
        inputs.token_valid.shape[1] - inputs.token_kv.shape[3])
    if extra == extra_token == extra_mel == 0:
        return inputs
    return EncoderInputs(
        xs=F.pad(inputs.xs, (0, 0) * (inputs.xs.dim() - 2) + (0, extra)),  # embeddings or codes
        code_valid=F.pad(inputs.code_valid, (0, extra)),
        lookahead=inputs.lookahead,
        upsample=inputs.upsample,
        token_kv=F.pad(inputs.token_kv, (0, 0, extra_token, 0)),
        token_valid=F.pad(inputs.token_valid, (extra_token, extra)),
        mel_kv=F.pad(inputs.mel_kv, (0, 0, extra_mel, 0)),
        mel_valid=F.pad(inputs.mel_valid, (extra_mel, stride * extra)),
    )
