"""A runner result's codes into a Talker chunk, a slice at a time instead of one by one.

A decode chain hands each request K draws. The chunk keeps the leading ones up to its end
(the first EOS, or the draw its budget allots to the forced EOS) and streams every group of
25 as it completes; the rest are dropped by the engine. Doing this per slice (list slicing,
`list.index`) instead of per code keeps the host work of a chain flat in K x batch.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.talker.request_state import FRAMES_PER_GROUP, ActiveChunk, TalkerStream


def codes_before_end(tokens: list[int], eos_id: int, room: int) -> int:
    """Leading draws of `tokens` the chunk keeps as codes: those before the first EOS, at
    most `room` (codes its budget still allows)."""
    limit = min(len(tokens), max(room, 0))
    try:
        return tokens.index(eos_id, 0, limit)
    except ValueError:
        return limit


def take_codes(chunk: ActiveChunk, codes: list[int], is_alive: Callable[[], bool]) -> bool:
    """Append `codes` to the chunk, sending each group the moment it is full, as one code at
    a time would. Returns False if a sink's send ended the request (the rest is not taken)."""
    start = 0
    while start < len(codes):
        unsent = len(chunk.codes) - chunk.num_sent
        end = min(len(codes), start + max(FRAMES_PER_GROUP - unsent, 1))
        chunk.codes.extend(codes[start:end])
        start = end
        if chunk.group_ready():
            chunk.condition.sink.send(chunk.take_group(finished=False))
            if not is_alive():
                return False
    return True


def active_chunk(stream: TalkerStream, token: int | None) -> ActiveChunk:
    """The chunk a draw of `stream` belongs to; RuntimeError if its policy failed in the step
    or nothing was drawn for a running chunk (the engine then fails that request)."""
    if stream.hook.error is not None:
        raise RuntimeError(f"chunk policy failed: {stream.hook.error!r}") from stream.hook.error
    if token is None or stream.active is None:
        raise RuntimeError(f"runner returned token {token} for an idle talker request")
    return stream.active


def take_one_by_one(
    stream: TalkerStream,
    tokens: list[int | None],
    take: Callable[[TalkerStream, list[int | None]], int],
    is_alive: Callable[[TalkerStream], bool],
    fault_hook: Callable[[str], None],
) -> int:
    """`take` code by code with the fault hook before each (fault injection tests); returns how
    many were used."""
    used = 0
    while used < len(tokens) and is_alive(stream):
        fault_hook(stream.request_id)
        chunk, used = stream.active, used + take(stream, tokens[used : used + 1])
        if stream.active is not chunk:
            break
    return used
