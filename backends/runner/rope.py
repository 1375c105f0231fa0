"""Rotary position embedding (rotate-half / neox pairing, as Qwen3 and Llama use) and re-rotation.

`rerotate_keys` moves already-rotated cached keys by `delta` positions: RoPE composes additively
(R(p) R(d) = R(p + d)), so rotating a key cached at position p by -drop gives exactly the key a
fresh prefill would have written at p - drop. Re-anchoring relies on this.
"""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] -> [..., head_dim]: (x1, x2) -> (-x2, x1) over the two halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim]; cos/sin: [num_tokens, head_dim] -> rotated x."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed on the fly from positions (no max-length table to outgrow)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE head_dim must be even, got {head_dim}")
        if not theta > 0:
            raise ValueError(f"rope theta must be > 0, got {theta}")
        self.head_dim = head_dim
        self.theta = theta
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        # Not persistent: the checkpoint never holds it, so state dicts stay HF-compatible.
        self.inv_freq: torch.Tensor  # [head_dim // 2] float32
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens] int64 -> (cos, sin), each [num_tokens, head_dim] in `dtype`.

        Angles are computed in float32 whatever `dtype` is, as HF does, so bf16 runs keep
        accurate phases at large positions.
        """
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rerotate_keys(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        """keys: [..., num_kv_heads, head_dim] rotated at some positions -> the same keys at
        positions + delta (a new tensor; math in float32, result in keys.dtype)."""
        return rerotate_keys(keys, delta, self.inv_freq)


def rerotate_keys(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate `keys` ([..., head_dim]) by `delta` positions with frequencies `inv_freq`
    ([head_dim // 2] float32). Values are never rotated, so only keys need this."""
    freqs = float(delta) * inv_freq.to(device=keys.device, dtype=torch.float32)
    angles = torch.cat((freqs, freqs), dim=-1)
    k32 = keys.to(torch.float32)
    rotated = k32 * angles.cos() + rotate_half(k32) * angles.sin()
    return rotated.to(keys.dtype)
