"""An append's prefill spread over several engine steps (chunked prefill).

A Thinker step batches every session's work, and on CUDA a step replays a graph only while each
request brings at most the mixed graphs' query rows (32). A new session's setup (system prompt,
reference-voice embeddings, the initial text: ~60-100 rows) or a rebuilt prompt is longer, so
its step ran eagerly, and everyone decoding beside it waited: ~28 ms of host-bound kernel
launches in the served 8B Thinker, once per new turn (measured in a served H200
benchmark). Here such an append goes in chunks of at most `limit` rows, split evenly (65 rows at
32: 22 + 22 + 21), each riding in a graphed mixed step with the other sessions' decodes; only
the last chunk samples. The rows land in KV exactly as one prefill would put them (the same
positions, attention over the same prefix).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from backends.runner.types import StepInput, StepResult
from backends.thinker.prompt_layout import AppendRows


def chunk_rows(remaining: int, limit: int) -> int:
    """Rows of the next chunk: all when `limit` <= 0 or they fit, else an even share."""
    if limit <= 0 or remaining <= limit:
        return remaining
    chunks = -(-remaining // limit)
    return -(-remaining // chunks)


@dataclass(slots=True)
class PrefillCursor:
    """How far one append's rows are in KV."""

    rows: AppendRows
    limit: int  # most rows per step; 0: the whole append in one step
    inputs: torch.Tensor | None = None  # [num_rows, hidden], materialized for the first chunk
    done: int = 0  # rows already forwarded
    first_position: int = -1  # KV position of the append's first row

    def step_input(
        self,
        request_id: str,
        embed_tokens: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device | str,
        dtype: torch.dtype,
        sample: bool,
    ) -> StepInput:
        """The next chunk; it samples only if it is the last and `sample` is set."""
        if self.inputs is None:
            self.inputs = self.rows.materialize(embed_tokens, device, dtype)
        end = self.done + chunk_rows(self.rows.num_rows - self.done, self.limit)
        last = end == self.rows.num_rows
        ids = self.rows.token_ids[self.done : end]
        return StepInput(request_id, ids, self.inputs[self.done : end], sample=sample and last)

    def advance(self, inp: StepInput, result: StepResult) -> bool:
        """Take a chunk's result; True once every row of the append is in KV."""
        if self.done == 0:
            self.first_position = result.positions[0]
        self.done += inp.num_rows
        if self.done < self.rows.num_rows:
            return False
        self.inputs = None  # the embeddings are in KV now
        return True
