"""START of a session's duplex stream. A START the server refuses for capacity
(`resource_exhausted`: a slot freed in the gateway a moment before the server freed it, or
sessions of other clients of the same server) is retried for a few seconds; any other refusal
is the client's answer."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from backends.gateway.commands import Init
from backends.gateway.duplex_stream import DuplexEvent, DuplexStream, stream_lost
from backends.gateway.errors import UPSTREAM_UNAVAILABLE, GatewayError

if TYPE_CHECKING:
    from backends.gateway.bridge import Bridge

START_RETRY_S = 5.0
RETRY_PAUSE_S = 0.25


async def open_session(bridge: "Bridge", init: Init) -> DuplexStream | None:
    """The created session's stream (session.created sent to the client), or None after the
    client heard the refusal."""
    params = {**bridge.state.config.session_defaults, **init.params}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_RETRY_S
    while True:
        stream = DuplexStream(bridge.state.client, bridge.context.session_id,
                              downlink_move_s=bridge.state.config.downlink_move_s)
        stream.open(params, init.ref_audio)
        first = await anext(stream.downlink, stream_lost("the downlink ended before an answer"))
        if first.type == "session.created":
            for message in bridge.codec.events(first):
                await bridge.send(message)
            return stream
        await _drain_refused(stream)
        if first.fields.get("code") != "resource_exhausted" or loop.time() > deadline:
            await _refused(bridge, first)
            return None
        await asyncio.sleep(RETRY_PAUSE_S)


async def _drain_refused(stream: DuplexStream) -> None:
    stream.release()
    async for _ in stream.downlink:
        pass


async def _refused(bridge: "Bridge", first: DuplexEvent) -> None:
    if first.type == "error":
        for message in bridge.codec.events(first):
            await bridge.send(message)
    else:
        await bridge.send_error(GatewayError(UPSTREAM_UNAVAILABLE, str(first.fields.get("stream_error", ""))))
    await bridge.send_closed("error")
