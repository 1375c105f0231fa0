"""Give a meta-built module real storage on a device, with random or loaded weights.

Building the full-size Thinker eagerly would draw float32 weights first (33 GB for the 8B
backbone) and then cast them; building on the meta device, casting there (free) and
allocating once in the target dtype needs only the final 16 GB and never touches the host.

`materialize` allocates every parameter and buffer uninitialised on the device, then either
draws random weights like the checkpoint generator (normal, std 0.02; biases zero; norms at
one; Whisper's sinusoid position table) or leaves parameters for a strict state-dict load.
Either way the computed buffers are rebuilt, and the RoPE frequencies stay float32 whatever
the model dtype: bfloat16 frequencies would put the phase of a high-frequency pair tens of
radians off by position 8000. A module type this file does not know how to initialise is
refused, so a new layer can never run on uninitialised memory.
"""

from __future__ import annotations

import torch
from torch import nn

from backends.models.decoder_backbone import RMSNorm
from backends.models.whisper_encoder import WhisperEncoder, whisper_sinusoids
from backends.runner.rope import RotaryEmbedding

INIT_STD = 0.02  # transformers' initializer_range, as the tiny checkpoint uses

# Module types whose own parameters/buffers are covered here; containers own none.
_WEIGHT_MODULES = (nn.Linear, nn.Embedding, nn.Conv1d)
_NORM_MODULES = (nn.LayerNorm, RMSNorm)


def materialize(module: nn.Module, device: torch.device | str, random_init: bool) -> None:
    """In place: `module` (built on meta, already in its dtype) gets storage on `device`.

    random_init=False leaves parameters uninitialised for a strict load that overwrites all.
    """
    _check_known(module)
    module.to_empty(device=device)
    with torch.no_grad():
        for sub in module.modules():
            _init_buffers(sub)
            if random_init:
                _init_parameters(sub)
        if random_init:  # after the generic pass, which drew the table as an embedding
            for sub in module.modules():
                if isinstance(sub, WhisperEncoder):
                    _init_sinusoids(sub)


def restore_rotary_precision(module: nn.Module) -> None:
    """Recompute every RoPE frequency table in float32 (a dtype cast lowers it)."""
    for sub in module.modules():
        if isinstance(sub, RotaryEmbedding):
            fresh = RotaryEmbedding(sub.head_dim, sub.theta).inv_freq
            sub.inv_freq = fresh.to(device=sub.inv_freq.device)


def _check_known(module: nn.Module) -> None:
    for name, sub in module.named_modules():
        owns = list(sub.parameters(recurse=False)) + list(sub.buffers(recurse=False))
        known = isinstance(sub, (*_WEIGHT_MODULES, *_NORM_MODULES, RotaryEmbedding))
        if owns and not known:
            raise TypeError(
                f"{name or 'the module'} ({type(sub).__name__}) has parameters or buffers "
                "that materialize() cannot initialise"
            )


def _init_buffers(sub: nn.Module) -> None:
    if isinstance(sub, RotaryEmbedding):
        restore_rotary_precision(sub)


def _init_parameters(sub: nn.Module) -> None:
    if isinstance(sub, _NORM_MODULES):
        sub.weight.fill_(1.0)
        if getattr(sub, "bias", None) is not None:
            sub.bias.zero_()
    elif isinstance(sub, _WEIGHT_MODULES):
        sub.weight.normal_(0.0, INIT_STD)
        if getattr(sub, "bias", None) is not None:
            sub.bias.zero_()


def _init_sinusoids(encoder: WhisperEncoder) -> None:
    """Whisper's position table is fixed sinusoids in every checkpoint, never learned."""
    table = encoder.embed_positions.weight
    table.copy_(whisper_sinusoids(table.shape[0], table.shape[1]).to(table.dtype))
