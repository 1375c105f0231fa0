"""A step's host-sampled rows on their way to the host: whole, or compact where the hook can
draw from a summary.

A hooked row goes to the host so its stage's policy can draw there. Whole, that is a 152k-entry
float32 row (~600 KB) per row: ~10 MB of device-to-host copy per batch-16 Thinker step, queued
behind the forward, and masks and penalties that then walk the row on the host. A hook that
offers `before_sample_compact` (the Thinker's duplex policy) gets a `CompactRow` instead: the
raw row's top candidates (`host_draws.TopCandidates`), its logsumexp, its values at the
runner's probe ids, and the largest value past the candidates' limit, a few KB per row. Where
the summary cannot decide a draw (rare: masks or penalties pushed too many candidates down),
`CompactRow.full` fetches the whole raw row from the device copy the step keeps until it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from backends.runner.host_draws import TOP_CANDIDATES, TopCandidates, argmax_among
from backends.runner.host_staging import to_device

# the outputs a compact row is made of (besides "host_logits": whole rows, handed as tensors)
SUMMARY_OUTPUTS = ("top_values", "top_ids", "logsumexp", "probes", "tail_max")

if TYPE_CHECKING:
    from backends.runner.request_states import RequestStates
    from backends.runner.types import RunnerConfig


@dataclass(slots=True)
class CompactRow:
    """One raw logits row as a summary (no mask or penalty applied to any of it)."""

    candidates: TopCandidates  # the largest values below `candidates.limit`, descending
    logsumexp: np.float32  # over the whole row
    probes: dict[int, np.float32]  # the runner's probe ids' values
    tail_max: np.float32  # the largest value from `candidates.limit` on (-inf: none)
    vocab: int
    fetch: Callable[[], torch.Tensor]  # the whole row to the host (a device read)
    _row: torch.Tensor | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        """Where the row's draw runs (its hook's generator lives there): the host."""
        return torch.device("cpu")

    def value(self, token: int) -> np.float32:
        """The raw logit of `token`, from the summary where it holds it."""
        if token in self.probes:
            return self.probes[token]
        hit = np.flatnonzero(self.candidates.ids == token)
        if hit.size:
            return self.candidates.values[hit[0]]
        return np.float32(self.full()[token])

    def is_argmax(self, token: int) -> bool:
        """Whether `token` (below the candidates' limit) is the raw row's argmax; no fetch
        where the largest value lies past the limit."""
        top = self.candidates
        if token < top.limit and top.values.size and self.tail_max > top.values[0]:
            return False
        return self.argmax() == token

    def argmax(self) -> int:
        """`torch.argmax` of the raw row."""
        top = self.candidates
        if top.values.size and self.tail_max > top.values[0]:
            return int(torch.argmax(self.full()))  # the largest lies past the limit
        best = argmax_among(top.values, top.ids, top.values[-1] if top.values.size else -np.inf)
        return best if best is not None else int(torch.argmax(self.full()))

    def full(self) -> torch.Tensor:
        """[vocab] float32 host copy of the raw row, a new one per call (the caller's to
        change); the device is read once."""
        if self._row is None:
            self._row = self.fetch()
        return self._row.clone()


class HostRows:
    """The host-sampled rows of one step: queues their copies (`outputs`, for the step's
    `AsyncOutput`) and hands each row to its host draw after the wait (`row`)."""

    def __init__(
        self,
        rows: torch.Tensor,
        compact: list[bool],
        limit: int,
        probe_ids: tuple[int, ...],
        with_candidates: bool,
    ) -> None:
        """rows: [n, vocab] float32 device logits of the host-sampled rows; compact: per row,
        whether its hook takes a `CompactRow`; limit: candidates are taken below it."""
        self.compact = compact
        self.vocab = int(rows.shape[-1])
        self.limit = limit or self.vocab
        self.probe_ids = tuple(p for p in probe_ids if 0 <= p < self.vocab)
        self._index = _positions(compact)
        self.outputs: dict[str, torch.Tensor] = {}
        self._device: torch.Tensor | None = None  # compact rows' raw values, for `full`
        self._host: dict[str, torch.Tensor] | None = None  # the step's host outputs, and
        self._host_arrays: dict[str, np.ndarray] = {}  # ... their summaries as numpy
        whole = [k for k, c in enumerate(compact) if not c]
        if whole:
            self.outputs["host_logits"] = _select(rows, whole)
        if with_candidates or len(whole) < len(compact):
            top = torch.topk(rows[:, : self.limit], min(TOP_CANDIDATES, self.limit))
            self.outputs["top_values"], self.outputs["top_ids"] = top.values, top.indices
        if len(whole) < len(compact):
            self._queue_summaries(rows, [k for k, c in enumerate(compact) if c])

    @classmethod
    def for_slots(
        cls, rows: torch.Tensor, slots: list[int], states: RequestStates, config: RunnerConfig
    ) -> HostRows:
        """The rows of `slots`, each compact where `wants_compact`; on CUDA with every row's
        top candidates (on a CPU row a whole-row draw's own top-k costs the same)."""
        compact = [
            wants_compact(config.compact_rows_on_cpu, rows.device, states.hooks[slot],
                          states.sampling[slot].repetition_penalty)
            for slot in slots
        ]  # fmt: skip
        return cls(rows, compact, config.candidate_ids, config.probe_ids,
                   with_candidates=rows.device.type == "cuda")

    def _queue_summaries(self, rows: torch.Tensor, picked: list[int]) -> None:
        # a copy, never a view: the step's graph buffers may be reused before `full`; all rows
        # (the usual case) and the few probe columns need no index copied to the device first
        if picked == list(range(rows.shape[0])):
            kept = rows.clone()
        else:
            kept = rows.index_select(0, to_device(np.asarray(picked, dtype=np.int64), rows.device))
        self._device = kept
        self.outputs["logsumexp"] = torch.logsumexp(kept, dim=-1)
        if self.probe_ids:
            self.outputs["probes"] = torch.stack([kept[:, p] for p in self.probe_ids], dim=1)
        if self.limit < self.vocab:
            self.outputs["tail_max"] = kept[:, self.limit :].amax(dim=-1)

    def candidates(self, host: dict[str, torch.Tensor]) -> list[TopCandidates | None]:
        """Each row's top candidates, where the step took them."""
        if "top_ids" not in host:
            return [None] * len(self.compact)
        values, ids = host["top_values"].numpy(), host["top_ids"].numpy()
        return [TopCandidates(values[k], ids[k], self.limit) for k in range(len(self.compact))]

    def row(self, k: int, host: dict[str, torch.Tensor]) -> torch.Tensor | CompactRow:
        """Row k for its draw: the host copy (the caller's to change), or its summary."""
        j = self._index[k]
        if not self.compact[k]:
            return host["host_logits"][j]
        arrays = self._arrays(host)
        probes = arrays["probes"][j] if "probes" in arrays else ()
        tail = arrays["tail_max"][j] if "tail_max" in arrays else np.float32(-np.inf)
        return CompactRow(
            candidates=TopCandidates(arrays["top_values"][k], arrays["top_ids"][k], self.limit),
            logsumexp=arrays["logsumexp"][j],
            probes=dict(zip(self.probe_ids, probes)),
            tail_max=tail,
            vocab=self.vocab,
            fetch=lambda: self._fetch(j),
        )

    def _arrays(self, host: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """The step's summary tensors as numpy, once per step: per row, a tensor index and
        `.numpy()` of each cost ~0.02 ms of a ~0.15 ms draw."""
        if self._host is not host:
            self._host = host
            self._host_arrays = {name: tensor.numpy() for name, tensor in host.items()
                                 if name in SUMMARY_OUTPUTS}  # fmt: skip
        return self._host_arrays

    def _fetch(self, j: int) -> torch.Tensor:
        assert self._device is not None
        return self._device[j].to("cpu", dtype=torch.float32, copy=True)


def wants_compact(on_cpu: bool, device: torch.device, hook: object, penalty: float) -> bool:
    """Whether a host-sampled row goes compact: its hook takes it, the runner applies no
    penalty of its own to it, and it is on CUDA, where the whole row is a device read (on the
    CPU only with `on_cpu`, as tests run it)."""
    if device.type != "cuda" and not on_cpu:
        return False
    return penalty == 1.0 and callable(getattr(hook, "before_sample_compact", None))


def _positions(flags: list[bool]) -> list[int]:
    """Each row's index among the rows of its own kind (whole or compact)."""
    seen = {True: 0, False: 0}
    index = []
    for flag in flags:
        index.append(seen[flag])
        seen[flag] += 1
    return index


def _select(rows: torch.Tensor, picked: list[int]) -> torch.Tensor:
    if picked == list(range(rows.shape[0])):
        return rows
    return rows.index_select(0, to_device(np.asarray(picked, dtype=np.int64), rows.device))
