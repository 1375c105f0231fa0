"""Folding weight-normalised checkpoint tensors into plain weights at load time.

Checkpoints store some layers (the Talker's `head_code`, most HiFT convs) weight-normalised:
W = g * v / ||v||, the norm taken over every dim except dim 0 (torch's `weight_norm(dim=0)`).
torch >= 2.1 names the pair `<layer>.parametrizations.weight.original0` (g) / `original1` (v);
the legacy API names it `<layer>.weight_g` / `<layer>.weight_v`. Folding once at load time
keeps the forward a plain matmul/conv (no per-call norm recomputation).
"""

from __future__ import annotations

import torch

_SPELLINGS = (
    (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
    (".weight_g", ".weight_v"),
)


def materialize_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """g: [out, 1, ...] magnitude, v: [out, ...] direction -> W: v's shape, float32 math.

    The norm runs over all dims except dim 0; for ConvTranspose1d dim 0 is the input channel.
    """
    if g.shape[0] != v.shape[0] or g.numel() != v.shape[0]:
        raise ValueError(f"weight-norm g shape {tuple(g.shape)} does not match v {tuple(v.shape)}")
    dims = tuple(range(1, v.dim()))
    norm = v.float().norm(dim=dims, keepdim=True)
    return (g.float().reshape(norm.shape) * v.float() / norm).to(v.dtype)


def split_weight_norm(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W -> (g, v) with g = ||W|| over dims except 0 and v = W, so folding returns W again."""
    dims = tuple(range(1, weight.dim()))
    return weight.norm(dim=dims, keepdim=True), weight.clone()


def fold_weight_norm_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return a copy where every (g, v) pair under either spelling becomes `<layer>.weight`.

    Raises ValueError naming the layer when only one half of a pair is present.
    """
    folded: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        spelling = _matching_spelling(key)
        if spelling is None:
            folded[key] = tensor
            continue
        g_suffix, v_suffix = spelling
        if key.endswith(v_suffix):
            continue  # handled together with its g half
        layer = key[: -len(g_suffix)]
        v = state_dict.get(layer + v_suffix)
        if v is None:
            raise ValueError(f"weight-norm layer {layer!r} has {g_suffix} but no {v_suffix}")
        folded[layer + ".weight"] = materialize_weight_norm(tensor, v)
    _check_orphan_directions(state_dict)
    return folded


def _matching_spelling(key: str) -> tuple[str, str] | None:
    for g_suffix, v_suffix in _SPELLINGS:
        if key.endswith(g_suffix) or key.endswith(v_suffix):
            return g_suffix, v_suffix
    return None


def _check_orphan_directions(state_dict: dict[str, torch.Tensor]) -> None:
    for g_suffix, v_suffix in _SPELLINGS:
        for key in state_dict:
            if key.endswith(v_suffix) and key[: -len(v_suffix)] + g_suffix not in state_dict:
                raise ValueError(f"weight-norm layer {key[: -len(v_suffix)]!r} has no {g_suffix}")
