"""Paged attention: per-step metadata, the KV write, and the backends that read pages.

The reference backend gathers each request's pages and runs SDPA in float32 with an explicit
lower-right causal mask (a query chunk with cached context must see the whole prefix; SDPA's
`is_causal` is upper-left aligned and would be wrong there). Faster backends register in
`ATTENTION_BACKENDS` under a name chosen by `RunnerConfig.attention_backend`: "triton" is the
CUDA fast path (`triton_paged_attention`), which also switches the model to its fused layer
kernels and the runner to persistent buffers and CUDA graphs (`fast_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Layout of one step's batch. Requests are in batch order (batch_idx), rows contiguous."""

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32 cumulative rows (cu_num_tokens)
    seq_lens: torch.Tensor  # [num_reqs] int32 tokens in KV after this step (context + query)
    context_lens: torch.Tensor  # [num_reqs] int32 tokens in KV before this step
    block_tables: torch.Tensor  # [num_reqs, max_blocks_per_req] int32 batch-ordered rows
    slot_mapping: torch.Tensor  # [num_tokens] int64 flat KV row (block_id * bs + offset)
    query_start_loc_np: np.ndarray  # [num_reqs + 1] int32 host mirror
    seq_lens_np: np.ndarray  # [num_reqs] int32 host mirror
    block_size: int
    backend: str = "reference"
    # Rows past query_start_loc[-1] (read on the device) are padding of a graphed batch and
    # belong to no request: the Triton backend writes zeros there (see `mixed_layout`).
    pad_tail: bool = False

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_np)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc_np[-1])


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter this step's K/V rows into their pages, in place.

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim];
    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64.
    Every entry must be a real row: the CPU path has no padding rows, and a padded GPU path
    must skip negative entries in its own write kernel.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def gather_pages(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """cache: [num_blocks, bs, H, D]; block_table_row: [max_blocks] int32 -> [seq_len, H, D]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    pages = cache.index_select(0, block_table_row[:num_blocks].to(torch.int64))
    return pages.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def causal_mask_lower_right(num_queries: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """[num_queries, seq_len] bool: query i (absolute index seq_len - num_queries + i) sees
    keys 0..its own index."""
    query_index = torch.arange(seq_len - num_queries, seq_len, device=device)
    key_index = torch.arange(seq_len, device=device)
    return key_index[None, :] <= query_index[:, None]


def paged_attention_reference(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    The current rows' K/V must already be in the cache (`write_kv` first). GQA by head groups.
    Loops over requests with host-side lengths from the metadata mirrors, never from device.
    """
    out = torch.empty_like(query)
    bounds = meta.query_start_loc_np
    for batch_idx in range(meta.num_reqs):
        start, end = int(bounds[batch_idx]), int(bounds[batch_idx + 1])
        seq_len = int(meta.seq_lens_np[batch_idx])
        row = meta.block_tables[batch_idx]
        key = gather_pages(k_cache, row, seq_len)
        value = gather_pages(v_cache, row, seq_len)
        out[start:end] = _attend_one(query[start:end], key, value, scale)
    return out


def _attend_one(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """query: [q, Hq, D]; key/value: [s, Hkv, D] -> [q, Hq, D], float32 math."""
    mask = causal_mask_lower_right(query.shape[0], key.shape[0], query.device)
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1).float(),
        key.transpose(0, 1).float(),
        value.transpose(0, 1).float(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1).to(query.dtype)


def _paged_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    # Imported on first use: Triton exists only where the fast path runs (GPU, or the
    # interpreter in tests), and the reference path must import without it.
    from backends.runner.triton_paged_attention import paged_attention_triton

    return paged_attention_triton(query, k_cache, v_cache, meta, scale)


AttentionBackend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor
]

# Read-only: a backend is added here in code, never registered at run time.
ATTENTION_BACKENDS: Mapping[str, AttentionBackend] = MappingProxyType(
    {"reference": paged_attention_reference, "triton": _paged_attention_triton}
)


def attend(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Dispatch to the backend named in `meta.backend`; same shapes as the reference."""
    return ATTENTION_BACKENDS[meta.backend](query, k_cache, v_cache, meta, scale)


def check_backend(name: str) -> None:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {sorted(ATTENTION_BACKENDS)}"
        )
