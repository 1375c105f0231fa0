"""One Thinker call of a session's Thinker loop, and how its failure ends the session."""
from __future__ import annotations

from typing import Callable, Protocol

from backends.contracts.errors import StageError
from backends.contracts.messages import ThinkerRequest, ThinkerUnitResult
from backends.contracts.stage_clients import THINKER, StageCallError
from backends.duplex import close_reasons as why


class _Caller(Protocol):
    def lock(self): ...

    def is_current(self, epoch: int) -> bool: ...

    def close(self, reason: str, error: StageError | None = None) -> None: ...

    def stop_if_stale(self, epoch: int, request_id: str, stages: tuple[str, ...]) -> None: ...


def call_thinker(session: _Caller, thinker: Callable, epoch: int, request: ThinkerRequest,
                 on_unit: Callable[[ThinkerUnitResult], None] | None) -> bool:
    """Send `request` of `epoch` and pass each unit result to `on_unit` (a setup append answers
    none). Returns False when a stage error closed the session; a failure of a stale epoch
    (stopped by a barge-in or a close) is not an error."""
    try:
        for result in thinker(request):
            if on_unit is not None:
                on_unit(result)
    except StageCallError as exc:
        with session.lock():
            stale = not session.is_current(epoch)
        if stale:
            return True
        session.close(why.ERROR, exc.error)
        return False
    finally:
        session.stop_if_stale(epoch, request.request_id, (THINKER,))
    return True
