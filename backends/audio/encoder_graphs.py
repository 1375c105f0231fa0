"""The streaming chunk's pass through the audio tower as CUDA graphs, one per (batch, keys) bucket.

An eager chunk pass (24 Whisper layers, projector, pool) is ~400 small kernels whose launches
the host issues one by one: ~16 ms per unit on an H200 host, for ~1 ms of GPU work, and it sits
on every reply's critical path (unit complete -> Thinker append). Here the pass after the conv
stack replays from a graph over static buffers:

- `hidden` [rows, n, d_model]: the cropped conv frames of each row's chunk (the conv stack
  stays eager: its input length differs between a stream's first unit and the others);
- `starts` [rows]: each row's cache length, i.e. the position of its first frame;
- a working KV cache [rows, layers, heads, max_source_positions, head_dim]: the sessions' held
  frames are copied in before the replay, the chunk's keys/values are written at each row's
  own positions inside the graph, attention sees the first `keys` positions with keys past a
  row's end masked out (as `BatchedKV` does eagerly), and the chunk's frames are copied back to
  the sessions' caches after the replay (only then do the cache lengths advance).

The key bucket is the smallest of 64, 128, 256, ... frames (the table's length last) that holds
every row's frames and chunk: attending over the whole 1500-frame table cost ~95 us a layer on
an H100 (~2.3 ms a unit, on the Thinker's stream right before its append) when a session holds
a few seconds; its first unit attends over 64 keys. Every bucket is captured at load
(`capture_all`), so serving never captures. On CUDA the attention runs through the split-key
Triton kernel (backends/models/chunk_attention_kernel.py: a row's keys split over more
programs, for the long buckets of long conversations: on an H100 a pass of one session over 1400
held frames takes 1.81 ms against 4.00 with torch's fused attention, perf/results/thinker_h100.md);
on the CPU through torch's, unless a test asks for the kernel (Triton's interpreter).

Rows beyond the sessions of a call (bucket padding) run on zeros at position 0 and are never
copied back. Without CUDA (tests) the same static-buffer pass runs eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.audio.encoder_model import AudioEncoderModel
from backends.models.encoder_kv import EncoderKVCache, KeyEnds
from backends.runner.cuda_graphs import capture_graph
from backends.runner.host_staging import copy_to_device

DEFAULT_MAX_ROWS = 4  # working cache: 147 MB per row at the real sizes in bf16
_WARMUP_RUNS = 2
_SMALLEST_KEYS = 64  # frames; a unit's chunk is 50


def key_buckets(table: int) -> tuple[int, ...]:
    """Key lengths a graph attends over: powers of two from 64 below `table`, then `table`."""
    sizes = [_SMALLEST_KEYS << i for i in range(table.bit_length()) if _SMALLEST_KEYS << i < table]
    return (*sizes, table)


class _WorkingKV:
    """`ChunkKV` over the static working cache: rows [0, size), positions [0, key_length)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, starts: torch.Tensor,
                 num_frames: int, key_length: int) -> None:
        size, device = starts.shape[0], starts.device
        self.keys, self.values = keys[:size, :, :, :key_length], values[:size, :, :, :key_length]
        self.positions = starts[:, None] + torch.arange(num_frames, device=device)  # [rows, n]
        self._rows = torch.arange(size, device=device)[:, None].expand_as(self.positions)
        self.ends = starts + num_frames  # a row attends to its frames [0, end)

    def attention_mask(self, split_keys: bool) -> torch.Tensor | KeyEnds:
        """The rows' ends for the split-key kernel, or the bool mask [rows, 1, 1, key_length]
        True below them."""
        if split_keys:
            return KeyEnds(self.ends.to(torch.int32))
        table = torch.arange(self.keys.shape[3], device=self.ends.device)
        return (table[None, :] < self.ends[:, None])[:, None, None, :]

    def append(self, layer: int, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # keys/values [rows, heads, n, head_dim] -> the layer's working cache up to key_length
        layer_keys, layer_values = self.keys[:, layer], self.values[:, layer]
        layer_keys[self._rows, :, self.positions] = keys.transpose(1, 2)
        layer_values[self._rows, :, self.positions] = values.transpose(1, 2)
        return layer_keys, layer_values


class ChunkEncoderGraphs:
    """Graphed chunk passes over one `AudioEncoderModel` for up to `max_rows` sessions a call."""

    def __init__(self, model: AudioEncoderModel, num_frames: int,
                 max_rows: int = DEFAULT_MAX_ROWS, split_keys: bool | None = None) -> None:
        """split_keys: attention through the split-key Triton kernel (None: on CUDA, torch's
        fused attention on the CPU; True on the CPU runs the kernel in Triton's interpreter)."""
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.model, self.num_frames, self.max_rows = model, num_frames, max_rows
        self.split_keys = self.is_graphed if split_keys is None else split_keys
        self.sizes = tuple(sorted({min(2**i, max_rows) for i in range(max_rows.bit_length() + 1)}))
        table = model.apm.config.max_source_positions
        self.key_sizes = tuple(size for size in key_buckets(table) if size >= min(num_frames, table))
        self._buffers: dict[str, torch.Tensor] | None = None  # allocated on first use
        # (rows, key length) -> graph and its output
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self._side: torch.cuda.Stream | None = None  # where captures warm up

    @property
    def is_graphed(self) -> bool:
        return self.model.apm.conv1.weight.device.type == "cuda"

    @torch.inference_mode()
    def encode(self, hidden: torch.Tensor, caches: list[EncoderKVCache]) -> torch.Tensor:
        """hidden: [b, n, d_model] cropped conv frames of b sessions' chunks (b <= max_rows),
        caches: their claimed caches (`cache_for` applied) -> [b, n // pool, llm_hidden]; each
        cache holds the chunk and has advanced by n when this returns."""
        size = self._bucket(len(caches))
        key_length = self._key_bucket(max(cache.length for cache in caches) + self.num_frames)
        buffers = self._stage(hidden, caches, size)
        out = self._run((size, key_length), buffers)[: len(caches)].clone()
        for row, cache in enumerate(caches):
            span = slice(cache.length, cache.length + self.num_frames)
            cache.keys[:, :, span] = buffers["keys"][row, :, :, span]
            cache.values[:, :, span] = buffers["values"][row, :, :, span]
            cache.length += self.num_frames
        return out

    def _bucket(self, rows: int) -> int:
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"a graphed chunk pass takes 1 to {self.max_rows} rows, got {rows}")
        return next(size for size in self.sizes if size >= rows)

    def _key_bucket(self, end: int) -> int:
        # `cache_for` restarts a cache before a chunk would reach the table, so end fits
        fitting = next((size for size in self.key_sizes if size >= end), None)
        if fitting is None:
            raise ValueError(f"a pass ending at frame {end} exceeds the key table "
                             f"{self.key_sizes[-1]}: claim the caches with `cache_for` first")
        return fitting

    def capture_all(self) -> int:
        """Capture every (rows, key length) graph now (at load), on zero inputs; returns how
        many there are. A no-op without CUDA."""
        if not self.is_graphed:
            return 0
        buffers = self._buffers or self._allocate()
        buffers["starts"].zero_()
        for shape in ((size, keys) for size in self.sizes for keys in self.key_sizes):
            self._run(shape, buffers)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-ups' cached blocks: the stage has a memory share
        return len(self._graphs)

    def _stage(self, hidden: torch.Tensor, caches: list[EncoderKVCache],
               size: int) -> dict[str, torch.Tensor]:
        buffers = self._buffers or self._allocate()
        rows = len(caches)
        buffers["hidden"][:rows].copy_(hidden)
        buffers["hidden"][rows:size].zero_()
        starts = np.array([cache.length for cache in caches] + [0] * (size - rows), np.int64)
        copy_to_device(buffers["starts"][:size], starts)  # no host wait for the GPU
        for row, cache in enumerate(caches):
            held = slice(0, cache.length)
            buffers["keys"][row, :, :, held] = cache.keys[:, :, held]
            buffers["values"][row, :, :, held] = cache.values[:, :, held]
        return buffers

    def _allocate(self) -> dict[str, torch.Tensor]:
        apm = self.model.apm
        config, weight = apm.config, apm.conv1.weight
        cache = (self.max_rows, config.encoder_layers, config.encoder_attention_heads,
                 config.max_source_positions, config.head_dim)
        self._buffers = {
            "hidden": weight.new_zeros(self.max_rows, self.num_frames, config.d_model),
            "starts": torch.zeros(self.max_rows, dtype=torch.int64, device=weight.device),
            "keys": weight.new_zeros(cache),
            "values": weight.new_zeros(cache),
        }
        return self._buffers

    def _run(self, shape: tuple[int, int], buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.is_graphed:
            return self._forward(shape, buffers)
        if shape not in self._graphs:
            self._graphs[shape] = self._capture(shape, buffers)
        graph, out = self._graphs[shape]
        graph.replay()
        return out

    def _forward(self, shape: tuple[int, int], buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        """The graphed work for (rows, key length): [rows, n // pool, llm_hidden] from the
        static buffers."""
        apm = self.model.apm
        size, key_length = shape
        kv = _WorkingKV(buffers["keys"], buffers["values"], buffers["starts"][:size],
                        self.num_frames, key_length)
        hidden = buffers["hidden"][:size] + apm.embed_positions.weight[kv.positions]
        return self.model.embed(apm.transform(hidden, kv.attention_mask(self.split_keys), kv))

    def _capture(self, shape: tuple[int, int],
                 buffers: dict[str, torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm-up and capture write the chunk's keys into the working cache only, at the
        # staged positions, which the replay that follows writes again: nothing is lost.
        # One warm-up stream for every capture: a new stream per graph kept each warm-up's
        # blocks apart (18 graphs: +6.7 GiB of peak in perf/bench_audio_encoder.py at the real
        # sizes), enough for the served Thinker to run out of its memory share at load on an H200.
        if self._side is None:
            self._side = torch.cuda.Stream()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return capture_graph(lambda: self._forward(shape, buffers), self._pool, _WARMUP_RUNS,
                             self._side)
