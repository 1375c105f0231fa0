"""The gateway's aiohttp application: the two WebSocket protocols, /metrics, and the browser
page at /. Startup reads the server's capacity; shutdown closes every session with a reason."""
from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import tritonclient.grpc.aio as grpcaio
from aiohttp import web

from backends.gateway.access import refusal
from backends.gateway.admission import AdmissionQueue
from backends.gateway.auth import ApiKeys
from backends.gateway.bridge import Bridge
from backends.gateway.capacity import server_capacity
from backends.gateway.config import GatewayConfig
from backends.gateway.demo_codec import DEMO_SUBPROTOCOL, DemoCodec
from backends.gateway.errors import VIDEO_UNSUPPORTED, GatewayError
from backends.gateway.gateway_state import GatewayState
from backends.gateway.realtime_codec import SUBPROTOCOL, VIDEO_MESSAGE, RealtimeCodec

STATE = web.AppKey("state", GatewayState)
STATIC = Path(__file__).parent / "static"
CAPACITY_REFRESH_S = 30.0
SERVER_WAIT_S = 120.0


def make_app(config: GatewayConfig) -> web.Application:
    app = web.Application()
    app[STATE] = GatewayState(config, AdmissionQueue(capacity=0, max_waiting=config.max_waiting),
                              ApiKeys.load(config.api_keys_file))
    app.router.add_get("/v1/realtime", realtime)
    app.router.add_get("/ws/duplex/{session_id}", demo)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", page)
    app.router.add_static("/static", STATIC)
    app.cleanup_ctx.append(_capacity)
    app.on_shutdown.append(_close_sessions)
    return app


async def realtime(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    refused = refusal(request, state)
    if refused is not None:
        return refused
    ws = await _accept(request, state, (SUBPROTOCOL,))
    bridge = Bridge(ws, RealtimeCodec, state)
    state.metrics.add("minicpmo_gateway_connections_total", protocol="realtime")
    if (request.query.get("mode") or "audio") != "audio":  # absent or empty: audio
        await bridge.send_error(GatewayError(VIDEO_UNSUPPORTED, VIDEO_MESSAGE))
        await ws.close()
        return ws
    await bridge.run()
    return ws


async def demo(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    refused = refusal(request, state)
    if refused is not None:
        return refused
    ws = await _accept(request, state, (DEMO_SUBPROTOCOL,))
    state.metrics.add("minicpmo_gateway_connections_total", protocol="demo")
    await Bridge(ws, functools.partial(DemoCodec, client_id=request.match_info["session_id"]), state).run()
    return ws


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.queue_gauges()
    return web.Response(text=state.metrics.render(), content_type="text/plain")


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def _accept(request: web.Request, state: GatewayState, protocols: tuple[str, ...]) -> web.WebSocketResponse:
    # Messages past the gateway's limit get an error message; past 4x it aiohttp closes (1009).
    # No permessage-deflate: a second of reply audio (128 KB of base64 float32) costs ~6 ms of
    # the gateway's CPU to deflate, and as much again per session in flight, to save ~24 %.
    ws = web.WebSocketResponse(protocols=protocols, max_msg_size=4 * state.config.max_message_bytes, heartbeat=30.0,
                               compress=False)
    await ws.prepare(request)
    return ws


async def _capacity(app: web.Application):
    """Connect to the server, read the capacity (waiting for the server to answer), then refresh
    it in the background."""
    state = app[STATE]
    state.client = grpcaio.InferenceServerClient(state.config.triton_url)  # on the serving loop
    state.admission.set_capacity(await asyncio.wait_for(_read_capacity(state), SERVER_WAIT_S))
    task = asyncio.ensure_future(_refresh(state))
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await state.client.close()


async def _read_capacity(state: GatewayState) -> int:
    while True:
        try:
            return await server_capacity(state.client)
        except Exception:  # the server is not up yet
            await asyncio.sleep(1.0)


async def _refresh(state: GatewayState) -> None:
    while True:
        await asyncio.sleep(CAPACITY_REFRESH_S)
        try:
            state.admission.set_capacity(await server_capacity(state.client))
        except Exception:  # a server restarting: keep the last capacity
            continue


async def _close_sessions(app: web.Application) -> None:
    state = app[STATE]
    state.shutting_down = True
    for bridge in list(state.live):
        bridge.shutdown()
    deadline = asyncio.get_running_loop().time() + state.config.drain_timeout_s + 2.0
    while state.live and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
