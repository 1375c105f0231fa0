"""Paged attention in Triton: split-KV over pages, graph-safe, one kernel for decode and appends.

One program per (request x query tile, kv head, kv split). A query tile holds `BLOCK_Q` query
rows times the `GROUP` query heads that share the kv head, so every K/V byte a tile reads
serves the whole GQA group. Keys are read in tiles of `TILE_N` tokens (`WIDE_TILE_N` in
mid-size decode batches) gathered through the block table (any page size), masked lower-right
causal from the device's `seq_lens` and `query_start_loc`. With more than one split, each
split writes a normalised partial output and its base-2 log-sum-exp, and a second kernel
(`split_merge`) merges them (flash-decoding), so batch 1 at long context still fills the GPU.

Launch shapes depend only on host values (shapes, the metadata's host mirrors), never on device
values, so a captured CUDA graph replays correctly when the device metadata changes. For a
captured graph the mirrors hold upper bounds (see `cuda_graphs` and `mixed_layout`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from backends.runner.attention import AttentionMetadata
from backends.runner.pdl import pdl_launch_args, wait_for_inputs
from backends.runner.split_merge import merge_splits

DECODE_ROWS = 16  # BLOCK_Q * GROUP_PAD for single-token queries (tl.dot needs >= 16 rows)
APPEND_ROWS = 64  # rows per tile when some request has several query tokens
TILE_N = 64  # key tokens per inner iteration
# Decode batches of at least a fifth of a wave of (request, kv head) programs read keys in
# tiles of WIDE_TILE_N (half the iterations per split, more bytes in flight) while their split
# grid stays within WIDE_MAX_WAVES programs per SM. H200 sweep of attention time, 128 over 64
# (perf/results/runner_h200.md): at 1-4k keys the Thinker 0.88-0.98x at batch 4, 0.91x at 8,
# 0.95x at 16, the Talker 0.81x at 16; batches 1-2 lose 1.1-1.2x (wide tiles leave splits
# idle), and so does the Thinker at 32 (1.1-1.17x: 128-dim heads in wide tiles halve the
# programs an SM holds); at 256 keys batches of 4-8 lose 8-20%.
WIDE_TILE_N = 128
WIDE_MAX_WAVES = 3
MAX_SPLITS = 64
# Split target: enough programs in flight to cover HBM latency. Even one key tile per split
# pays off here: on the H200 a Talker layer (12 heads, 256 keys) took 4.4 us as 5 one-tile
# splits + merge and 7.3 us unsplit (perf/results/runner_h200.md).
PROGRAMS_PER_SM = 2


@triton.jit
def _load_kv_tile(
    key_cache_ptr,
    value_cache_ptr,
    table_row_ptr,  # this request's block-table row
    offs_n,  # [TILE] logical key indices
    kv_len,
    head_offset,
    stride_c_tok,
    offs_d,
    PAGE: tl.constexpr,
):
    """([TILE, HEAD_DIM] keys, values) gathered through the block table; zeros past kv_len."""
    n_ok = offs_n < kv_len
    page = tl.load(table_row_ptr + offs_n // PAGE, mask=n_ok, other=0)
    kv_rows = (page.to(tl.int64) * PAGE + offs_n % PAGE) * stride_c_tok
    kv_offs = kv_rows[:, None] + head_offset + offs_d[None, :]
    key = tl.load(key_cache_ptr + kv_offs, mask=n_ok[:, None], other=0.0)
    value = tl.load(value_cache_ptr + kv_offs, mask=n_ok[:, None], other=0.0)
    return key, value


# Batch-dependent ints (value classes == 1, % 16, other) and the merge's row-count pointer (a
# slice: its alignment varies) are not specialised; `warm_variants` compiles the constexprs.
@triton.jit(do_not_specialize=["num_q_tiles", "num_splits"])
def _paged_attention_kernel(
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, page, num_kv_heads, head_dim]
    value_cache_ptr,  # same layout as key_cache_ptr
    out_ptr,  # [num_tokens, num_heads, head_dim], written when not IS_SPLIT
    partial_out_ptr,  # [num_tokens, num_heads, num_splits, head_dim] float32
    partial_lse_ptr,  # [num_tokens, num_heads, num_splits] float32
    block_tables_ptr,  # [num_reqs, max_blocks] int32
    query_start_loc_ptr,  # [num_reqs + 1] int32
    seq_lens_ptr,  # [num_reqs] int32
    scale_log2,  # softmax scale * log2(e): the kernel works in base 2
    stride_q_tok, stride_q_head, stride_c_tok, stride_c_head, stride_bt,
    stride_o_tok, stride_o_head,
    num_heads, num_q_tiles, num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, IS_SPLIT: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    req, q_tile = tl.program_id(0) // num_q_tiles, tl.program_id(0) % num_q_tiles
    kv_head, split = tl.program_id(1), tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    context = tl.load(seq_lens_ptr + req) - q_len
    offs_m = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + offs_m // GROUP_PAD
    group_idx = offs_m % GROUP_PAD
    head = kv_head * GROUP + group_idx
    row_ok = (q_idx < q_len) & (group_idx < GROUP)
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (q_begin + q_idx).to(tl.int64) * stride_q_tok + head * stride_q_head
    query = tl.load(query_ptr + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    # Keys this tile can see: the context plus its own last query row (0 for an idle tile).
    tile_q_end = tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)
    kv_len = tl.where(q_tile * BLOCK_Q < q_len, context + tile_q_end, 0)
    num_tiles = tl.cdiv(kv_len, TILE)
    per_split = tl.cdiv(num_tiles, num_splits)
    t_begin, t_end = split * per_split, tl.minimum(split * per_split + per_split, num_tiles)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    table_row = block_tables_ptr + req * stride_bt
    for t in range(t_begin, t_end):
        offs_n = t * TILE + tl.arange(0, TILE)
        key, value = _load_kv_tile(
            key_cache_ptr, value_cache_ptr, table_row, offs_n, kv_len,
            kv_head * stride_c_head, stride_c_tok, offs_d, PAGE,
        )  # fmt: skip
        scores = tl.dot(query, tl.trans(key)) * scale_log2
        visible = (offs_n[None, :] < kv_len) & (offs_n[None, :] <= (context + q_idx)[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        acc, l_i, m_i = _online_softmax_step(acc, l_i, m_i, scores, value)
    tok = (q_begin + q_idx).to(tl.int64)
    if IS_SPLIT:
        part = (tok * num_heads + head) * num_splits + split
        _store_partial(partial_out_ptr, partial_lse_ptr, acc, l_i, m_i, part, row_ok, HEAD_DIM)
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        o_offs = (tok * stride_o_tok + head * stride_o_head)[:, None] + offs_d[None, :]
        tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _store_partial(
    partial_out_ptr, partial_lse_ptr, acc, l_i, m_i, part, row_ok, HEAD_DIM: tl.constexpr
):
    """One split's normalised output rows and their base-2 log-sum-exp (-inf: saw no key)."""
    has_keys = l_i > 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    tl.store(partial_lse_ptr + part, lse, mask=row_ok)
    offs_d = tl.arange(0, HEAD_DIM)
    part_offs = part[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(partial_out_ptr + part_offs, out, mask=row_ok[:, None])


@triton.jit
def _online_softmax_step(acc, l_i, m_i, scores, value):
    """Fold one tile of base-2 scores [BLOCK_M, TILE] (masked: -inf) and its values into the
    running (acc, row sum, row max); rows that saw no key yet keep max -inf and sum 0."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    probs = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(probs, 1)
    acc = acc * alpha[:, None] + tl.dot(probs.to(value.dtype), value)
    return acc, l_new, m_new


def num_kv_splits(num_programs: int, max_seq_len: int, num_sms: int, tile: int = TILE_N) -> int:
    """Splits per (query tile, kv head) so that about PROGRAMS_PER_SM programs run per SM,
    never more splits than key tiles of the longest sequence."""
    wanted = -(-PROGRAMS_PER_SM * num_sms // max(num_programs, 1))
    return max(1, min(wanted, MAX_SPLITS, -(-max_seq_len // tile)))


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter on CPU: few programs keep tests fast
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    splits: int | None = None,
    tile: int | None = None,
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    Same contract as `paged_attention_reference`: the step's K/V are already in the cache.
    k_cache/v_cache: [num_blocks, page, num_kv_heads, head_dim], contiguous per page.
    `splits` and `tile` override the heuristics (tests force the merge path and the key tile
    with them). With `meta.pad_tail` the merge always runs and writes zeros into the padding
    rows.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q, num_q_tiles, heuristic, wide = _launch_shape(meta, group_pad, num_kv_heads,
                                                          query.device)  # fmt: skip
    splits = heuristic if splits is None else splits
    tile = (WIDE_TILE_N if wide else TILE_N) if tile is None else tile
    is_split = splits > 1 or meta.pad_tail
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    partial_shape = (num_tokens, num_heads, splits) if is_split else (1, 1, 1)
    partial_lse = torch.empty(partial_shape, dtype=torch.float32, device=query.device)
    partial_out = torch.empty((*partial_shape, head_dim), dtype=torch.float32, device=query.device)
    grid = (meta.num_reqs * num_q_tiles, num_kv_heads, splits)
    _paged_attention_kernel[grid](
        query, k_cache, v_cache, out, partial_out, partial_lse,
        meta.block_tables, meta.query_start_loc, meta.seq_lens,
        scale * math.log2(math.e),
        query.stride(0), query.stride(1), k_cache.stride(1), k_cache.stride(2),
        meta.block_tables.stride(0), out.stride(0), out.stride(1),
        num_heads, num_q_tiles, splits,
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, TILE=tile,
        HEAD_DIM=head_dim, PAGE=page, IS_SPLIT=is_split,
        num_warps=4, num_stages=2, **pdl_launch_args(query.device),
    )  # fmt: skip
    if is_split:
        merge_splits(partial_out, partial_lse, out, meta.query_start_loc[meta.num_reqs :],
                     meta.pad_tail)  # fmt: skip
    return out


def _launch_shape(
    meta: AttentionMetadata, group_pad: int, num_kv_heads: int, device: torch.device
) -> tuple[int, int, int, bool]:
    """(query rows per tile, query tiles per request, heuristic split count, wide key tiles),
    all from the host mirrors (upper bounds for a graphed batch) so a graph's grid never
    depends on device values."""
    max_query_len = int((meta.query_start_loc_np[1:] - meta.query_start_loc_np[:-1]).max())
    rows = DECODE_ROWS if max_query_len <= 1 else APPEND_ROWS
    block_q = max(1, rows // group_pad)
    num_q_tiles = -(-max_query_len // block_q)
    num_programs = meta.num_reqs * num_q_tiles * num_kv_heads
    max_seq_len, num_sms = int(meta.seq_lens_np.max()), _num_sms(device)
    splits = num_kv_splits(num_programs, max_seq_len, num_sms)
    wide = (rows == DECODE_ROWS and 5 * num_programs >= num_sms
            and num_programs * splits <= WIDE_MAX_WAVES * num_sms)  # fmt: skip
    if wide:
        splits = num_kv_splits(num_programs, max_seq_len, num_sms, WIDE_TILE_N)
    return block_q, num_q_tiles, splits, wide


# Splits that reach every merge variant: unsplit, then each power-of-two SPLITS_PAD up to 64.
WARM_SPLITS = (1, 2, 3, 5, 9, 17, 33)


def warm_variants(
    k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, blocks_per_req: int
) -> int:
    """Compile every variant serving can launch (decode and append row tiles x unsplit or each
    merge width x with or without a padded graph tail, and the decode tile's wide key tiles)
    on one-request batches that read page 0 of the given caches and write only their own
    outputs; returns the launches made. An eager prefill at a shape no warm-up request had
    compiled a variant inside a first reply (~0.6 s on an H200)."""
    device, head_dim = k_cache.device, k_cache.shape[3]
    launches = 0
    for rows in (1, 2):  # a decode tile, an append tile
        query = torch.zeros((rows, num_heads, head_dim), dtype=k_cache.dtype, device=device)
        for pad_tail in (False, True):
            meta = _one_request_meta(rows, blocks_per_req, k_cache.shape[1], device, pad_tail)
            for splits in WARM_SPLITS:
                paged_attention_triton(query, k_cache, v_cache, meta, 1.0, splits=splits, tile=TILE_N)
                launches += 1
    decode = torch.zeros((1, num_heads, head_dim), dtype=k_cache.dtype, device=device)
    meta = _one_request_meta(1, blocks_per_req, k_cache.shape[1], device, False)
    for splits in (1, 2):  # the wide key tile, unsplit and split (decode only)
        paged_attention_triton(decode, k_cache, v_cache, meta, 1.0, splits=splits, tile=WIDE_TILE_N)
        launches += 1
    return launches


def _one_request_meta(rows: int, blocks_per_req: int, page: int, device: torch.device,
                      pad_tail: bool) -> AttentionMetadata:
    """`rows` new tokens and no context, every block-table entry at page 0."""
    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return AttentionMetadata(
        query_start_loc=i32([0, rows]), seq_lens=i32([rows]), context_lens=i32([0]),
        block_tables=torch.zeros((1, blocks_per_req), dtype=torch.int32, device=device),
        slot_mapping=torch.arange(rows, dtype=torch.int64, device=device),
        query_start_loc_np=np.array([0, rows], dtype=np.int32),
        seq_lens_np=np.array([rows], dtype=np.int32), block_size=page, backend="triton",
        pad_tail=pad_tail,
    )  # fmt: skip
