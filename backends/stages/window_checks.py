"""Which Code2Wav windows are accepted: their content, and their place in the request's
(cache_epoch, chunk_seq) sequence (docs/model_facts.md#code2wav-windows).

Within an epoch chunk_seq must be previous + 1; a higher epoch must start at 0 and replaces the
request's vocoder state; a lower epoch is `stale_cache_epoch`. A rejected window never advances
the sequence. Errors are "<code>: <detail>" strings with a code from the ERROR_* names.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.contracts.messages import Code2WavRequest
from backends.stages.voice_cache import reference_error

ERROR_STALE_EPOCH = "stale_cache_epoch"
ERROR_CHUNK_SEQ = "out_of_order_chunk_seq"
ERROR_AFTER_LAST = "chunk_after_last_chunk"
ERROR_EMPTY_CHUNK = "empty_chunk"
ERROR_BELOW_LOOKAHEAD = "chunk_below_lookahead_window"
ERROR_CODE_RANGE = "code_out_of_range"
ERROR_LEFT_CONTEXT = "left_context_mismatch"


def content_error(request: Code2WavRequest, lookahead: int, vocab: int) -> str | None:
    """What is wrong with the window itself (None: nothing); `lookahead` is the vocoder's
    look-ahead in codes, `vocab` its codebook size."""
    codes = request.codes
    reference = reference_error(request.ref_audio, request.chunk_seq)
    if reference is not None:
        return reference
    if codes.size == 0 and not request.last_chunk:
        return f"{ERROR_EMPTY_CHUNK}: non-final chunk {request.chunk_seq} has no codes"
    # the left context is the previous window's look-ahead, decoded in this window
    if codes.size and request.num_left_context != lookahead:
        return (f"{ERROR_LEFT_CONTEXT}: num_left_context {request.num_left_context} != "
                f"the vocoder's look-ahead {lookahead}")
    if not request.last_chunk and codes.size <= lookahead:
        return (f"{ERROR_BELOW_LOOKAHEAD}: non-final chunk {request.chunk_seq} has "
                f"{codes.size} codes, needs more than {lookahead}")
    if codes.size and (codes.min() < 0 or codes.max() >= vocab):
        return (f"{ERROR_CODE_RANGE}: codes must lie in [0, {vocab}), "
                f"got {codes.min()}..{codes.max()}")
    return None


@dataclass(slots=True)
class _Sequence:
    """Where a request's accepted windows stand."""

    cache_epoch: int
    next_seq: int
    is_closed: bool  # a last_chunk was accepted for this epoch


class WindowSequences:
    """Each live request's accepted (cache_epoch, chunk_seq) position."""

    def __init__(self) -> None:
        self._sequences: dict[str, _Sequence] = {}

    def error(self, request: Code2WavRequest) -> str | None:
        """Why the window cannot come next in its request's sequence (None: it can)."""
        seq = self._sequences.get(request.request_id)
        epoch, chunk_seq = request.cache_epoch, request.chunk_seq
        if seq is not None and epoch < seq.cache_epoch:
            return f"{ERROR_STALE_EPOCH}: cache_epoch {epoch} < current {seq.cache_epoch}"
        if seq is None or epoch > seq.cache_epoch:
            if chunk_seq != 0:
                return (f"{ERROR_CHUNK_SEQ}: epoch {epoch} must start at chunk_seq 0, "
                        f"got {chunk_seq}")
            return None
        if seq.is_closed:
            return f"{ERROR_AFTER_LAST}: epoch {epoch} already ended with its last chunk"
        if chunk_seq != seq.next_seq:
            return f"{ERROR_CHUNK_SEQ}: expected chunk_seq {seq.next_seq}, got {chunk_seq}"
        return None

    def accept(self, request: Code2WavRequest) -> None:
        seq = self._sequences.get(request.request_id)
        if seq is None or request.cache_epoch > seq.cache_epoch:
            seq = self._sequences[request.request_id] = _Sequence(request.cache_epoch, 0, False)
        seq.next_seq = request.chunk_seq + 1
        seq.is_closed = request.last_chunk

    def drop(self, request_id: str) -> None:
        self._sequences.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._sequences)
