"""Triton building blocks of a fused draw: one program draws one row as `sample_on_device` does.

`device_sampler.sample_on_device` is temperature -> top-k -> top-p -> argmax(scaled + Gumbel)
in ~30 small torch kernels over the whole vocabulary (a full sort among them). A row's program
holds its padded logits in registers instead and finds the top-k survivors by block reductions,
one max and one count per distinct value from the top (so the survivors come out sorted and
ties at the k-th value are kept, as the sort's `>= kth` keeps them); for top-k <= CACHE the
distinct values and counts stay in a small register vector and top-p is a cumsum over it.
Rows without a top-k (or a larger one) walk the vocabulary's values from the top again for
top-p, a pass per value: correct for any parameters, fast for the Talker's (top-k 25).

Bit-compatibility with the torch path, which stays the reference:
- the noise is the same splitmix64 counter hash, in uint64 (wrapping multiplication and
  logical shifts give the bits of torch's wrapping int64 ops);
- division is IEEE (`div_rn`: Triton's fp32 `/` is approximate), log and exp are CUDA's
  logf / expf on the GPU (libdevice; Triton's fp32 `exp` is approximate); the interpreter (CPU
  tests) has no libdevice, so there they are taken in float64 and rounded;
- the top-p mass is summed in a different order than torch's cumsum: a row whose mass before
  some survivor lies within float rounding of top_p may keep one token more or less, and a tie
  group that straddles top_p is kept whole (torch keeps an arbitrary part of it).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def mix64(x):
    """splitmix64's finaliser on uint64: `device_sampler.mix64`."""
    x = x ^ (x >> 30)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 27)
    x = x * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def step_seed(seed, position):
    """int64 seed and position -> the uint64 step seed of `device_sampler.step_seeds`."""
    first = mix64(seed.to(tl.uint64, bitcast=True) + 0x9E3779B97F4A7C15)
    mixed = mix64((first ^ position.to(tl.uint64, bitcast=True)) + 0x9E3779B97F4A7C15)
    return mixed >> 1


@triton.jit
def log32(x, PRECISE: tl.constexpr):
    """float32 log as torch's (CUDA logf; interpreted: float64, rounded)."""
    if PRECISE:
        y = libdevice.log(x)
    else:
        y = tl.log(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def exp32(x, PRECISE: tl.constexpr):
    """float32 exp as torch's (CUDA expf; interpreted: float64, rounded)."""
    if PRECISE:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x.to(tl.float64)).to(tl.float32)
    return y


@triton.jit
def gumbel_at(seed, tokens, PRECISE: tl.constexpr):
    """The Gumbel noise of `device_sampler.gumbel_noise` at int tokens, for a uint64 step seed."""
    bits = mix64(seed + (tokens.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15) >> 41
    uniform = (bits.to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2^-23
    return -log32(-log32(uniform, PRECISE), PRECISE)


@triton.jit
def next_below(s, valid, value):
    """The largest valid value of `s` under `value` (-inf when none)."""
    return tl.max(tl.where(valid & (s < value), s, NEG_INF), 0)


@triton.jit
def count_of(s, valid, value):
    return tl.sum((valid & (s == value)).to(tl.int32), 0)


@triton.jit
def top_values(s, valid, top, k, CACHE: tl.constexpr):
    """-> (sorted(s, descending)[k - 1] over the valid lanes, ties counted; the distinct
    values from `top` down to it and their counts in [CACHE] vectors, whole when k <= CACHE).

    A `for` over k passes with an `active` mask, not a `while`: compiled (not interpreted),
    Triton 3.6 returned the `while` loop's carried k-th value as its initial value (measured
    on an H200: kth == top, while the value vectors were right), so every row kept only its
    top token. Each active pass takes at least one lane, so k passes reach the k-th value."""
    ids = tl.arange(0, CACHE)
    values = tl.full([CACHE], NEG_INF, tl.float32)
    counts = tl.zeros([CACHE], tl.int32)
    value = top
    kth = top
    taken = tl.zeros((), tl.int32)
    count = taken + 1
    for i in range(0, k):
        active = (taken < k) & (count > 0)  # a lane set empties only past the last value
        count = tl.where(active, count_of(s, valid, value), count)
        values = tl.where((ids == i) & active, value, values)
        counts = tl.where((ids == i) & active, count, counts)
        taken += tl.where(active, count, 0)
        kth = tl.where(active, value, kth)
        value = tl.where(active, next_below(s, valid, value), value)
    return kth, values, counts


@triton.jit
def cached_top_p_floor(values, counts, top, top_p, PRECISE: tl.constexpr):
    """`top_p_floor` from `top_values`' vectors: no pass over the vocabulary."""
    weights = exp32(values - top, PRECISE) * counts.to(tl.float32)  # empty entries: 0
    mass = tl.math.div_rn(weights, tl.sum(weights, 0) + tl.zeros_like(weights))
    before = tl.cumsum(mass, 0) - mass
    return tl.min(tl.where((counts > 0) & (before < top_p), values, float("inf")), 0)


@triton.jit
def top_p_floor(s, valid, top, kth, top_p, passes, PRECISE: tl.constexpr):
    """The smallest value top-p keeps among the survivors `s >= kth`: the values whose
    softmax mass before them is below top_p (`mask_top_k_top_p`'s rule, per distinct value).
    `passes` bounds the distinct survivor values (a masked `for`: see `top_values`)."""
    total = tl.sum(tl.where(valid & (s >= kth), exp32(s - top, PRECISE), 0.0), 0)
    mass = tl.zeros((), tl.float32)
    value = top
    floor = top
    for _ in range(0, passes):
        active = (mass < top_p) & (value >= kth) & (value > NEG_INF)
        prob = tl.math.div_rn(exp32(value - top, PRECISE), total)
        mass += tl.where(active, prob * count_of(s, valid, value).to(tl.float32), 0.0)
        floor = tl.where(active, value, floor)
        value = tl.where(active, next_below(s, valid, value), value)
    return floor


@triton.jit
def draw_row(
    x, offs, valid, temperature, top_k, top_p, seed, CACHE: tl.constexpr, PRECISE: tl.constexpr
):
    """A row's token from its (processed) float32 logits `x`: greedy argmax at temperature
    0, else argmax over the top-k/top-p survivors of x / temperature + Gumbel noise."""
    token = tl.argmax(tl.where(valid, x, NEG_INF), 0)
    if temperature != 0.0:
        s = tl.math.div_rn(x, temperature + tl.zeros_like(x))
        top = tl.max(tl.where(valid, s, NEG_INF), 0)
        k = tl.where((top_k > 0) & (top_k < x.shape[0]), top_k, x.shape[0]).to(tl.int32)
        kth = tl.min(tl.where(valid, s, float("inf")), 0)
        floor = kth
        num_valid = tl.sum(valid.to(tl.int32), 0)
        if k < num_valid:
            kth, values, counts = top_values(s, valid, top, k, CACHE)
            floor = kth
            if (top_p < 1.0) & (k <= CACHE):
                floor = cached_top_p_floor(values, counts, top, top_p, PRECISE)
        if (top_p < 1.0) & ((k >= num_valid) | (k > CACHE)):  # many survivors: walk the vocab
            floor = top_p_floor(s, valid, top, kth, top_p, tl.minimum(k, num_valid), PRECISE)
        keep = valid & (s >= tl.maximum(kth, floor))
        token = tl.argmax(tl.where(keep, s + gumbel_at(seed, offs, PRECISE), NEG_INF), 0)
    return token.to(tl.int64)
