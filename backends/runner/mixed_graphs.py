"""Mixed batches (appends next to decodes) through persistent buffers and CUDA graphs.

A duplex session appends ~13 rows per second and decodes in between, so with many sessions
almost every step mixes a few appends with many decodes. Such a batch, when every request
holds at most `max_query_len` rows, runs in a bucket (R requests, T tokens) of
`mixed_layout`: its layout, input embeddings and logits rows are staged into buffers
allocated once here, and the bucket's graph replays the same kernels the eager fast path
runs (fused layers, Triton paged attention with a grid and split count fixed by the bucket,
the LM head over R rows). The graph writes the final hidden rows and the float32 logits into
persistent outputs (`hidden`, `logits`), shared by all buckets, so the graphs' own
activations can all share one memory pool; read them (or copy them) before the next step.

Graphs are captured at start, largest bucket first, into one pool (the decode graphs' pool
when given). A capture that fails is logged once and its bucket stays eager: batches then go
to the next bucket that holds them, or to the eager path. Without CUDA every bucket runs the
same forward eagerly over the same buffers, so this path is testable on CPU. Sampling stays
outside the graph (device rows are drawn eagerly after it, host-hook rows on the host), as
for any eager step; graphed sampling is decode-only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from backends.runner.backbone import DecoderModel
from backends.runner.cuda_graphs import capture_graph
from backends.runner.host_staging import PinnedStaging
from backends.runner.kv_cache import KVCache
from backends.runner.mixed_layout import Bucket, MixedLayout, choose_bucket, mixed_buckets
from backends.runner.types import RunnerConfig, StepInput

_LOG = logging.getLogger(__name__)


class MixedGraphs:
    def __init__(
        self, model: DecoderModel, kv: KVCache, layout: MixedLayout, buckets: Sequence[Bucket]
    ) -> None:
        self.model = model
        self.kv = kv
        self.layout = layout
        self.buckets = tuple(sorted(buckets))
        device, dtype = kv.data.device, kv.data.dtype
        self._i64 = torch.zeros(layout.i64_size, dtype=torch.int64, device=device)
        self._i32 = torch.zeros(layout.i32_size, dtype=torch.int32, device=device)
        self._i64_staging, self._i32_staging = PinnedStaging(self._i64), PinnedStaging(self._i32)
        self._views = layout.views(self._i64, self._i32)
        shape = (layout.max_tokens, model.hidden_size)
        self.embeds = torch.zeros(shape, dtype=dtype, device=device)
        self.hidden = torch.zeros(shape, dtype=dtype, device=device)
        with torch.no_grad():
            vocab = model.compute_logits(self.hidden[:1]).shape[-1]
        self.logits = torch.zeros(layout.max_reqs, vocab, dtype=torch.float32, device=device)
        self._metas = {b: layout.metadata(self._i64, self._i32, b) for b in self.buckets}
        self._graphs: dict[Bucket, torch.cuda.CUDAGraph] = {}
        self.num_replays = 0  # graphed steps served (tests and benchmarks read it)
        self.failed: list[Bucket] = []  # buckets whose capture failed (they run eagerly)

    @classmethod
    def for_config(
        cls, model: DecoderModel, config: RunnerConfig, kv: KVCache, pad_block: int,
        req_sizes: Sequence[int],
    ) -> MixedGraphs | None:  # fmt: skip
        """The runner's mixed graphs, or None where they are off (config switch, or on CUDA
        without CUDA graphs) or no bucket fits the config."""
        on_cuda = kv.data.device.type == "cuda"
        if not config.mixed_cuda_graphs or (on_cuda and not config.use_cuda_graphs):
            return None
        query = config.mixed_graph_max_query_len
        buckets = mixed_buckets(req_sizes, config.mixed_graph_tokens, query)
        if not buckets:
            return None
        layout = MixedLayout(
            max_reqs=max(r for r, _ in buckets), max_tokens=max(t for _, t in buckets),
            max_blocks=config.max_blocks_per_req, max_query_len=query,
            max_seq_len=config.max_model_len, block_size=kv.block_size, pad_block=pad_block,
        )  # fmt: skip
        return cls(model, kv, layout, buckets)

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def bucket_for(self, num_rows: Sequence[int]) -> Bucket | None:
        """The bucket a batch runs in: on CUDA a captured one, on CPU any (run eagerly)."""
        usable = self.buckets if self.kv.data.device.type != "cuda" else tuple(self._graphs)
        return choose_bucket(usable, num_rows, self.layout.max_query_len)

    def stage(
        self,
        bucket: Bucket,
        inputs: Sequence[StepInput],
        contexts: np.ndarray,
        block_rows: np.ndarray,
        sampled: Sequence[int],
    ) -> np.ndarray:
        """Fill the buffers for one step; returns [n + 1] int64 row offsets per input.

        contexts: [n] tokens in KV before the step; block_rows: [n, max_blocks] int32;
        sampled: indices of the inputs that sample (their last rows get logits, in order)."""
        num_rows = np.asarray([inp.num_rows for inp in inputs], dtype=np.int64)
        cu = np.concatenate([[0], np.cumsum(num_rows)])
        ids = [[0] * inp.num_rows if inp.embeds is not None else inp.token_ids for inp in inputs]
        token_ids = np.concatenate([np.zeros(0, np.int64), *(np.asarray(r) for r in ids)])
        logit_rows = [int(cu[i + 1]) - 1 for i in sampled]
        contexts = np.asarray(contexts, dtype=np.int64)
        layout = self.layout
        layout.stage_i64(num_rows, contexts, block_rows, token_ids, logit_rows,
                         out=self._i64_staging.host())
        layout.stage_i32(num_rows, contexts, block_rows, out=self._i32_staging.host())
        self._i64_staging.publish()
        self._i32_staging.publish()
        self._stage_embeds(bucket[1], inputs, cu)
        return cu

    def _stage_embeds(self, tokens: int, inputs: Sequence[StepInput], cu: np.ndarray) -> None:
        """Embed the bucket's token rows, then copy injected rows over theirs."""
        self.embeds[:tokens].copy_(self.model.embed_tokens(self._views["token_ids"][:tokens]))
        for i, inp in enumerate(inputs):
            if inp.embeds is None:
                continue
            source = inp.embeds
            if self.embeds.device.type == "cuda" and source.device.type == "cpu":
                source = source.pin_memory()  # a pageable source would block the host
            self.embeds[int(cu[i]) : int(cu[i + 1])].copy_(source, non_blocking=True)

    def run(self, bucket: Bucket) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward the staged bucket: ([T, hidden] final hidden rows, [R, vocab] float32
        logits of the staged logits rows), views of the persistent outputs."""
        graph = self._graphs.get(bucket)
        if graph is None:
            self.forward_eager(bucket)
        else:
            graph.replay()
            self.num_replays += 1
        reqs, tokens = bucket
        return self.hidden[:tokens], self.logits[:reqs]

    def forward_eager(self, bucket: Bucket) -> None:
        """The bucket's forward without its graph (what capture records)."""
        reqs, tokens = bucket
        hidden = self.model.forward(
            self.embeds[:tokens], self._views["positions"][:tokens], self._metas[bucket], self.kv
        )
        self.hidden[:tokens].copy_(hidden)
        rows = hidden.index_select(0, self._views["logit_rows"][:reqs])
        self.logits[:reqs].copy_(self.model.compute_logits(rows))

    def replay(self, bucket: Bucket) -> None:
        """Replay a captured bucket on whatever is staged (benchmarks time this)."""
        self._graphs[bucket].replay()

    def capture(self, pool: tuple[int, int] | None = None, warmup_steps: int = 2) -> None:
        """Capture every bucket, largest first, into `pool` (a fresh one by default). Stages
        padding only, so warm-up and capture touch the pad block alone."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        empty = np.zeros(0, dtype=np.int64)
        blocks = np.zeros((0, self.layout.max_blocks), dtype=np.int32)
        side = torch.cuda.Stream()  # every warm-up on one stream: its cached blocks are reused
        for bucket in sorted(self.buckets, key=lambda b: (b[1], b[0]), reverse=True):
            self.stage(bucket, [], empty, blocks, [])
            try:
                self._graphs[bucket], _ = capture_graph(
                    lambda: self.forward_eager(bucket), pool, warmup_steps, side
                )
            except RuntimeError:
                self._note_failure(bucket)
        torch.cuda.synchronize()

    def _note_failure(self, bucket: Bucket) -> None:
        """Log the first failed capture (with its traceback); the bucket stays eager."""
        if not self.failed:
            _LOG.warning(
                "mixed CUDA graph capture failed for bucket %s; it and any later failing "
                "bucket run eagerly", bucket, exc_info=True,
            )  # fmt: skip
        self.failed.append(bucket)
