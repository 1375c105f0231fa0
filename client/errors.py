"""The client's exceptions: each names what went wrong, so callers can react per kind."""


class DuplexTimeout(TimeoutError):
    """A wait on the server passed its deadline."""


class DuplexStreamError(RuntimeError):
    """The server is unreachable or the gRPC stream broke."""


class DuplexProtocolError(RuntimeError):
    """The server broke the client contract of the `duplex` model."""


class DuplexStateError(RuntimeError):
    """A session method was called out of order (for example `append` before `start`)."""
