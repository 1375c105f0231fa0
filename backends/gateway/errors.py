"""The gateway's own error codes (the server's codes pass through unchanged:
docs/duplex_contract.md, "Errors"). A `GatewayError` becomes an error message of the client's
protocol."""
from __future__ import annotations

BAD_JSON = "invalid_json"
UNKNOWN_TYPE = "unknown_event_type"
INVALID_EVENT = "invalid_event"
NOT_INITIALIZED = "session_not_initialized"
INVALID_AUDIO = "invalid_audio"
MESSAGE_TOO_LARGE = "message_too_large"
RATE_LIMITED = "input_rate_exceeded"
VIDEO_UNSUPPORTED = "video_not_supported"
QUEUE_FULL = "queue_full"
INIT_TIMEOUT = "init_timeout"
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
SERVER_SHUTDOWN = "server_shutdown"


class GatewayError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


class ClientGone(Exception):
    """The client's WebSocket closed."""
