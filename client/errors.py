"""The client's exceptions: each names what went wrong, so callers can react per kind."""


class DuplexTimeout(TimeoutError):
    """A wait on the server passed its deadline."""


class DuplexStreamError(RuntimeError):
    """The server is unreachable or the gRPC stream broke.

    `code` says which: `stream_failed` in general, `server_restarting` when the server went
    away under an open stream (gRPC UNAVAILABLE): `minicpmo-server` restarts a server that
    died within seconds plus its load time, so a new session can follow once it is ready.
    """

    def __init__(self, message: str, code: str = "stream_failed") -> None:
        super().__init__(message)
        self.code = code


class DuplexProtocolError(RuntimeError):
    """The server broke the client contract of the `duplex` model."""


class DuplexStateError(RuntimeError):
    """A session method was called out of order (for example `append` before `start`)."""
