"""Persistent per-request state, one row (slot) per live request, recycled on free.

Every per-slot field is reset when a slot is handed out, so a recycled slot can never show a
previous request's tokens, counters, sampling params or hook.
"""

from __future__ import annotations

import numpy as np

from backends.runner.types import AdmissionError, SamplingHook, SamplingParams


class RequestStates:
    def __init__(self, max_num_reqs: int, max_model_len: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.req_id_to_slot: dict[str, int] = {}
        self.slot_to_req_id: list[str | None] = [None] * max_num_reqs
        # Popped from the end: slot 0 first, and the most recently freed slot is reused first,
        # which is the order that exposes stale-state bugs soonest.
        self._free_slots: list[int] = list(range(max_num_reqs - 1, -1, -1))
        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int64)  # [max_num_reqs]
        self.max_len_np = np.zeros(max_num_reqs, dtype=np.int64)  # [max_num_reqs] reserved tokens
        self.num_dropped_np = np.zeros(max_num_reqs, dtype=np.int64)  # [max_num_reqs] reanchored
        # [max_num_reqs] steps of the slot's last decode chain that `discard_tail` may take back
        self.chain_tail_np = np.zeros(max_num_reqs, dtype=np.int64)
        # [max_num_reqs, max_model_len] int64 ledger id of every row now in KV, in KV order
        self.token_ids_np = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.sampling: list[SamplingParams] = [SamplingParams()] * max_num_reqs
        self.hooks: list[SamplingHook | None] = [None] * max_num_reqs
        self.generated: list[list[int]] = [[] for _ in range(max_num_reqs)]

    @property
    def num_active(self) -> int:
        return len(self.req_id_to_slot)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def add(
        self,
        request_id: str,
        sampling: SamplingParams,
        hook: SamplingHook | None,
        max_len: int,
    ) -> int:
        if request_id in self.req_id_to_slot:
            raise ValueError(f"request {request_id!r} is already active")
        if not self._free_slots:
            raise AdmissionError(
                f"request {request_id!r}: all {self.max_num_reqs} runner slots are in use"
            )
        slot = self._free_slots.pop()
        self._reset_slot(slot)
        self.req_id_to_slot[request_id] = slot
        self.slot_to_req_id[slot] = request_id
        self.sampling[slot] = sampling
        self.hooks[slot] = hook
        self.max_len_np[slot] = max_len
        return slot

    def remove(self, request_id: str) -> int | None:
        """Free the request's slot; returns it, or None if the request is unknown."""
        slot = self.req_id_to_slot.pop(request_id, None)
        if slot is None:
            return None
        self._reset_slot(slot)
        self._free_slots.append(slot)
        return slot

    def slot_of(self, request_id: str) -> int:
        slot = self.req_id_to_slot.get(request_id)
        if slot is None:
            raise ValueError(f"unknown request {request_id!r} (never added, or already freed)")
        return slot

    def samples_on_host(self, slot: int) -> bool:
        """A host hook or the HF penalty needs the logits row on the host; every other row is
        drawn on the device (through the runner's DeviceLogitsProcessor, if any)."""
        return self.hooks[slot] is not None or self.sampling[slot].repetition_penalty != 1.0

    def token_ids(self, slot: int) -> list[int]:
        """Ledger ids of the rows now in KV, oldest first."""
        return self.token_ids_np[slot, : self.num_computed_tokens_np[slot]].tolist()

    def append_tokens(self, slot: int, token_ids: list[int]) -> None:
        start = int(self.num_computed_tokens_np[slot])
        self.token_ids_np[slot, start : start + len(token_ids)] = token_ids
        self.num_computed_tokens_np[slot] = start + len(token_ids)
        self.chain_tail_np[slot] = 0

    def commit_chain(self, slot: int, start: int, tokens: list[int]) -> None:
        """A decode chain of K = len(tokens) steps from KV index `start` (its rows already
        counted by `append_tokens`) finished: its drawn tokens 0..K-2 were the inputs of rows
        start+1.., and all K join the drawn history."""
        self.token_ids_np[slot, start + 1 : start + len(tokens)] = tokens[:-1]
        self.generated[slot].extend(tokens)
        self.chain_tail_np[slot] = len(tokens)

    def discard_tail(self, slot: int, count: int) -> None:
        """Take back the last `count` steps of the slot's last decode chain: their KV rows
        (left in place for later steps to overwrite) and their draws."""
        if not 0 <= count <= self.chain_tail_np[slot]:
            raise ValueError(
                f"cannot discard {count} steps: the last decode chain of slot {slot} left "
                f"{int(self.chain_tail_np[slot])} to discard"
            )
        if count:
            self.num_computed_tokens_np[slot] -= count
            del self.generated[slot][-count:]
            self.chain_tail_np[slot] -= count

    def drop_tokens(self, slot: int, start: int, count: int) -> None:
        """Remove `count` rows at KV index `start`; later rows move down by `count`."""
        end = int(self.num_computed_tokens_np[slot])
        row = self.token_ids_np[slot]
        row[start : end - count] = row[start + count : end].copy()
        self.num_computed_tokens_np[slot] = end - count
        self.num_dropped_np[slot] += count
        self.chain_tail_np[slot] = 0

    def _reset_slot(self, slot: int) -> None:
        self.slot_to_req_id[slot] = None
        self.num_computed_tokens_np[slot] = 0
        self.max_len_np[slot] = 0
        self.num_dropped_np[slot] = 0
        self.chain_tail_np[slot] = 0
        self.token_ids_np[slot] = 0
        self.sampling[slot] = SamplingParams()
        self.hooks[slot] = None
        self.generated[slot] = []
