"""Demultiplexing of one session's gRPC stream: downlink events vs uplink FINALs.

The START request (id `DOWNLINK_REQUEST_ID`) carries the downlink: one event per response,
ending with a FINAL (empty, or on the last event). Every other request gets exactly one empty
FINAL at once, except a downlink move (`action=move_downlink`): once the server takes it, the
current downlink request ends with a `downlink.moved` event and the move request carries the
downlink from then on. Triton reports an in-band error without the request id, so such an error
becomes a `RequestFailed` event and stands for the FINAL of some unanswered request; when no
uplink request can own it, it was START's and the downlink is over.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import InferResult
from tritonclient.utils import InferenceServerException

from client.errors import DuplexProtocolError, DuplexStreamError
from client.events import (
    REQUEST_FAILED_TYPE,
    DuplexEvent,
    EventParseError,
    RequestFailed,
    parse_event,
)

DOWNLINK_REQUEST_ID = "downlink"
DOWNLINK_MOVED_TYPE = "downlink.moved"  # never shown to the caller: the demux follows the move
FINAL_PARAMETER = "triton_final_response"

SERVER_GONE_STATUS = "StatusCode.UNAVAILABLE"  # tritonclient's status when the server went away


@dataclass(frozen=True, slots=True)
class Arrival:
    """One stream callback: exactly one of `result` and `error` is set."""

    received_s: float  # time.monotonic() on the stream thread
    result: InferResult | None
    error: InferenceServerException | None


class DownlinkDemux:
    """Routes the responses of one stream and tracks which requests still await a FINAL."""

    def __init__(self, session_id: str | int):
        self.session_id = session_id
        self._downlinks: list[str] = []  # request ids carrying the downlink, without a FINAL
        self._moving: str | None = None  # a move request the server has not taken yet
        self._ended: set[str] = set()  # request ids that carried the downlink up to their FINAL
        self._pending_uplink: set[str] = set()  # uplink request ids without a FINAL
        self._num_failed = 0  # in-band errors, each the FINAL of an unnamed uplink request

    @property
    def downlink_open(self) -> bool:
        return bool(self._downlinks)

    @property
    def moving(self) -> bool:
        """A downlink move was sent and the server has not taken it yet."""
        return self._moving is not None

    @property
    def num_pending_uplink(self) -> int:
        return len(self._pending_uplink) - self._num_failed

    @property
    def is_settled(self) -> bool:
        """True once the downlink and every uplink request got their FINAL."""
        return not self.downlink_open and self.num_pending_uplink <= 0

    def open_downlink(self) -> None:
        self._downlinks = [DOWNLINK_REQUEST_ID]

    def expect_uplink(self, request_id: str) -> None:
        if request_id in self._downlinks or request_id in self._ended or request_id in self._pending_uplink:
            raise ValueError(f"uplink request id {request_id!r} is already in use")
        self._pending_uplink.add(request_id)

    def expect_move(self, request_id: str) -> None:
        """`request_id` asks the server to carry the downlink. Until the server takes it, it
        counts as an uplink request: refused, it gets an in-band error like any other."""
        if self._moving is not None:
            raise ValueError(f"downlink move {self._moving!r} is still under way")
        self.expect_uplink(request_id)
        self._moving = request_id

    def process(self, arrival: Arrival) -> DuplexEvent | None:
        """The event this arrival carries, if any; raises on a broken stream or contract."""
        if arrival.error is not None:
            return self._on_error(arrival.error, arrival.received_s)
        response = arrival.result.get_response()
        is_final = (
            FINAL_PARAMETER in response.parameters
            and response.parameters[FINAL_PARAMETER].bool_param
        )
        if response.id == self._moving:  # the move request answers: it carries the downlink
            self._take_move()
        if response.id in self._downlinks:
            return self._on_downlink(response.id, arrival, is_final)
        if response.id in self._ended:
            raise self._fail("downlink response after its FINAL")
        self._on_uplink(response.id, [output.name for output in response.outputs], is_final)
        return None

    def _fail(self, what: str) -> DuplexProtocolError:
        return DuplexProtocolError(f"session {self.session_id}: {what}")

    def _on_uplink(self, request_id: str, outputs: list[str], is_final: bool) -> None:
        if request_id not in self._pending_uplink:
            raise self._fail(f"response for unknown request id {request_id!r}")
        if outputs or not is_final:
            raise self._fail(
                f"uplink request {request_id!r} must get one empty FINAL, got outputs {outputs}"
                f" final={is_final}"
            )
        self._pending_uplink.discard(request_id)
        if self.downlink_open and self._num_failed > len(self._pending_uplink):
            # More unnamed failures than unanswered uplinks: one of them was the downlink's.
            self._num_failed -= 1
            self._downlinks.clear()

    def _take_move(self) -> None:
        assert self._moving is not None
        self._pending_uplink.discard(self._moving)
        self._downlinks.append(self._moving)
        self._moving = None

    def _on_downlink(self, request_id: str, arrival: Arrival, is_final: bool) -> DuplexEvent | None:
        event = self._parse(arrival)
        if event is not None and event.type == DOWNLINK_MOVED_TYPE:
            if not is_final or self._moving is None and len(self._downlinks) < 2:
                raise self._fail(f"{DOWNLINK_MOVED_TYPE} without a move under way, or not final")
            if self._moving is not None:
                self._take_move()
            self._end_downlink(request_id)
            return None
        if is_final:
            self._end_downlink(request_id)
        elif event is None:
            raise self._fail("non-final downlink response without EVENT")
        return event

    def _end_downlink(self, request_id: str) -> None:
        self._downlinks.remove(request_id)
        self._ended.add(request_id)

    def _parse(self, arrival: Arrival) -> DuplexEvent | None:
        payload = arrival.result.as_numpy("EVENT")  # [1] object (bytes), or None
        if payload is None:
            return None
        if payload.size != 1:
            raise self._fail(f"EVENT must hold one element, got shape {payload.shape}")
        audio = arrival.result.as_numpy("AUDIO_OUT")  # [n] int16 24 kHz, or None
        try:
            return parse_event(payload.reshape(-1)[0], received_s=arrival.received_s, audio=audio)
        except EventParseError as exc:
            raise self._fail(str(exc)) from exc

    def _on_error(self, error: InferenceServerException, received_s: float) -> RequestFailed:
        if error.status() is not None:
            # A gRPC status means the stream itself ended: nothing more will arrive.
            self._downlinks.clear()
            self._moving = None
            self._pending_uplink.clear()
            self._num_failed = 0
            if error.status() == SERVER_GONE_STATUS:
                raise DuplexStreamError(
                    f"session {self.session_id}: server_restarting: the server went away under"
                    f" the open stream ({error.message()}); open a new session once it is ready",
                    code="server_restarting",
                )
            raise DuplexStreamError(
                f"session {self.session_id}: gRPC stream failed ({error.status()}):"
                f" {error.message()}"
            )
        if self.downlink_open and self.num_pending_uplink <= 0:
            self._downlinks.clear()  # no unanswered uplink request can own it: the downlink's
        else:
            self._num_failed += 1
        return RequestFailed(REQUEST_FAILED_TYPE, self.session_id, received_s, error.message())
