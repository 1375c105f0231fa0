"""Request ids the Talker engine has ended (stopped or failed), remembered for a while.

A condition that arrives after its request was stopped (a handoff already in flight at a barge-in)
must not quietly start a new Talker request and produce audio for a cancelled turn
(docs/architecture.md edge case 7). A request id can legitimately come back (a client reusing a
session id gets the same "<session>.e0"), and a new request always starts at condition_seq 0, so
seq 0 clears the record while any other seq is refused.
"""

from __future__ import annotations

from collections import OrderedDict

from backends.contracts.errors import StageError

# Enough for every session of a long-running server to be remembered well past the
# seconds a late handoff can take; the oldest ids are forgotten first.
DEFAULT_CAPACITY = 4096


class EndedRequests:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"EndedRequests capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._errors: OrderedDict[str, StageError] = OrderedDict()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._errors

    def add(self, request_id: str, error: StageError) -> None:
        self._errors[request_id] = error
        self._errors.move_to_end(request_id)
        while len(self._errors) > self._capacity:
            self._errors.popitem(last=False)

    def refusal(self, request_id: str, condition_seq: int) -> StageError | None:
        """The error for a late condition of an ended request, or None to accept it."""
        error = self._errors.get(request_id)
        if error is None:
            return None
        if condition_seq == 0:
            del self._errors[request_id]
            return None
        return StageError(error.code, f"talker request {request_id} already ended: {error.message}")
