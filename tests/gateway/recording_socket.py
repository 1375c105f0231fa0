"""A websocket factory for the SDK that keeps every raw server message, so that tests can check
fields the SDK does not surface (response.done's status, session.closed's reason)."""
from __future__ import annotations

import json

from openbmb_realtime.transport import default_websocket_factory


class Recording:
    def __init__(self, socket) -> None:
        self.socket = socket
        self.received: list[dict] = []

    async def send(self, message: str) -> None:
        await self.socket.send(message)

    async def recv(self):
        data = await self.socket.recv()
        self.received.append(json.loads(data))
        return data

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.socket.close(code, reason)

    def of(self, kind: str) -> list[dict]:
        return [event for event in self.received if event.get("type") == kind]


class RecordingFactory:
    def __init__(self) -> None:
        self.sockets: list[Recording] = []

    async def __call__(self, url, *, headers, subprotocols, options):
        socket = Recording(await default_websocket_factory(url, headers=headers, subprotocols=subprotocols,
                                                           options=options))
        self.sockets.append(socket)
        return socket
