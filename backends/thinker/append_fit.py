"""Room in the session's KV reservation for an activating append (the Thinker engine's rule).

Before an append's rows are prefilled, its session's context window may make room: a `basic`
cut re-anchors the KV in place on the runner, a `context` drop re-prefills a rebuilt prompt
into a fresh request. Then the append plus a whole unit's decode must fit the `max_len` tokens
the request reserved, or the session ends with `context_length_exceeded`.
"""

from __future__ import annotations

from backends.contracts.errors import StageFailure
from backends.runner.model_runner import ModelRunner
from backends.runner.types import SamplingParams
from backends.thinker.prompt_layout import AppendRows
from backends.thinker.session_state import ThinkerSession


def fit_window(runner: ModelRunner, session: ThinkerSession, rows: AppendRows, max_len: int) -> None:
    """Make room before an append: a rebuilt prompt replaces the KV (`context`), or a cut
    re-anchors it in place (`basic`)."""
    rid, window = session.request_id, session.window
    if rows.restarts:
        window.on_restart(runner.num_tokens(rid))
        runner.free_request(rid)
        runner.add_request(rid, SamplingParams(seed=session.policy.seed), session.hook, max_len)
    else:
        incoming = rows.num_rows + session.decode_budget
        cut = window.plan_cut(runner.num_tokens(rid), incoming)
        if cut is not None:
            runner.reanchor(rid, cut.keep_prefix, cut.drop)
            window.apply_cut(cut)
    session.policy.position_offset = window.position_offset


def check_context(runner: ModelRunner, session: ThinkerSession, num_rows: int, max_len: int) -> None:
    """The append plus a whole unit's decode (the terminator is never forwarded) must fit:
    the request reserved exactly `max_len` tokens of KV."""
    needed = runner.num_tokens(session.request_id) + num_rows + session.decode_budget
    if needed > max_len:
        raise StageFailure(
            "context_length_exceeded",
            f"context_length_exceeded: request {session.request_id!r} needs {needed} "
            f"tokens, its context is {max_len} (window {session.window.mode})",
        )
