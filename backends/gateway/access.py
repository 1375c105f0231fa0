"""The checks of a WebSocket upgrade request, before any queueing or model work: the browser
origin and the API key. A refused request gets a plain HTTP answer, never a WebSocket."""
from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web

from backends.gateway.auth import presented_key
from backends.gateway.gateway_state import GatewayState


def subprotocols_of(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    return [entry.strip() for entry in header.split(",") if entry.strip()]


def origin_allowed(request: web.Request, allowed: tuple[str, ...]) -> bool:
    """No Origin (not a browser), the gateway's own origin, or one of `allowed` ("*": any)."""
    origin = request.headers.get("Origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    return urlsplit(origin).netloc == request.host


def refusal(request: web.Request, state: GatewayState) -> web.Response | None:
    """The HTTP answer that refuses the request, or None when it may go on."""
    if state.shutting_down:
        return _refuse(state, 503, "shutting_down", "the gateway is shutting down")
    if not origin_allowed(request, state.config.allowed_origins):
        return _refuse(state, 403, "origin", "this origin is not allowed")
    if not state.keys.accepts(presented_key(request.headers, subprotocols_of(request))):
        return _refuse(state, 401, "api_key", "a valid API key is required")
    return None


def _refuse(state: GatewayState, status: int, reason: str, text: str) -> web.Response:
    state.metrics.add("minicpmo_gateway_refusals_total", reason=reason)
    return web.json_response({"error": {"code": reason, "message": text}}, status=status)
