"""Batched sampling on the logits' device with counter-based Gumbel noise, no host sync.

The noise of one row is a pure function of its 63-bit step seed (`sampler.step_seed(seed,
position)`) and the token id: a splitmix64 mix of `step_seed + (token + 1) * golden` in
wrapping int64 torch ops, whose top 23 bits make a uniform in (0, 1). So a request's draw is
the same whatever rows share the batch, on whatever device, eager or inside a CUDA graph, and
the host sampler (`sampler.sample_token`) draws the very same noise for one row.

Order per row, as the host sampler: temperature -> top-k -> top-p -> argmax(scaled + Gumbel);
temperature 0 is a plain argmax of the raw logits.
"""

from __future__ import annotations

import torch


def _signed(value: int) -> int:
    """A 64-bit value (taken mod 2^64) as the int64 torch stores (two's complement)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def as_int64(seed: int) -> int:
    """A request seed as stored in a device table (its low 64 bits, as `step_seed` uses)."""
    return _signed(seed)


GOLDEN = _signed(0x9E3779B97F4A7C15)
MIX1 = _signed(0xBF58476D1CE4E5B9)
MIX2 = _signed(0x94D049BB133111EB)
UNIFORM_BITS = 23  # bits + 0.5 then needs 24 bits: exact in float32 on any device


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic on signed ints)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 with wrapping multiplication (CPU and CUDA agree)."""
    x = x ^ _shift_right(x, 30)
    x = x * MIX1
    x = x ^ _shift_right(x, 27)
    x = x * MIX2
    return x ^ _shift_right(x, 31)


def step_seeds(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """seeds: [rows] int64 (`as_int64`), positions: [rows] int64 -> [rows] int64 step seeds,
    bitwise `sampler.step_seed(seed, position)` (splitmix64 is mix64(x + golden))."""
    first = mix64(seeds + GOLDEN)
    return _shift_right(mix64((first ^ positions) + GOLDEN), 1)


def uniform_noise(step_seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """step_seeds: [rows] int64 -> [rows, vocab_size] float32 uniforms in (0, 1)."""
    token = torch.arange(vocab_size, dtype=torch.int64, device=step_seeds.device)
    return uniform_at(step_seeds[:, None], token[None, :])


def uniform_at(step_seeds: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The uniforms of `uniform_noise` at given token ids only (broadcasting int64 tensors):
    a draw over a few candidates sees the very noise a whole-vocabulary draw would. Id -1
    keys a uniform that no token's noise uses."""
    mixed = mix64(step_seeds + (token_ids + 1) * GOLDEN)
    bits = _shift_right(mixed, 64 - UNIFORM_BITS)
    return (bits.to(torch.float32) + 0.5) * (2.0**-UNIFORM_BITS)


def gumbel_noise(step_seeds: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """step_seeds: [rows] int64 -> [rows, vocab_size] float32 standard Gumbel noise."""
    return -torch.log(-torch.log(uniform_noise(step_seeds, vocab_size)))


def mask_top_k_top_p(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """scaled: [rows, vocab] float32 (already divided by temperature); top_k: [rows] int64
    (-1 off); top_p: [rows] float32 (1 off) -> the logits with filtered tokens at -inf.

    One descending sort serves both filters: top-k keeps ties at the k-th value, top-p keeps
    the smallest head of the top-k survivors whose probability mass reaches top_p.
    """
    vocab = scaled.shape[-1]
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    k_index = torch.where(top_k > 0, top_k.clamp(max=vocab) - 1, vocab - 1)
    kth_value = sorted_logits.gather(1, k_index[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return scaled.masked_fill(drop | (scaled < kth_value), float("-inf"))


def sample_on_device(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    step_seeds: torch.Tensor,
    use_filters: bool,
) -> torch.Tensor:
    """logits: [rows, vocab] float32; temperature/top_p: [rows] float32; top_k, step_seeds:
    [rows] int64 -> [rows] int64 tokens. `use_filters` (a host flag: does any row set top-k or
    top-p) skips the sort when no row needs it; filters never change a greedy row's argmax."""
    is_greedy = temperature == 0.0
    scaled = logits / torch.where(is_greedy, 1.0, temperature)[:, None]
    if use_filters:
        scaled = mask_top_k_top_p(scaled, top_k, top_p)
    noise = gumbel_noise(step_seeds, logits.shape[-1])
    return torch.argmax(scaled + noise.masked_fill(is_greedy[:, None], 0.0), dim=-1)
