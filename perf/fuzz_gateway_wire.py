"""Sending one case of perf/fuzz_gateway_inputs.py over a WebSocket and reading what came back:
the handshake's refusal, or the gateway's messages until the session is closed, the socket
closes, or the case drops the connection itself. It uses the asyncio client: the sync client of
websockets can drop the messages that came just before the server's close."""
from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.parse
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.asyncio.client import ClientConnection, connect

from perf.fuzz_gateway_inputs import DEMO, REALTIME, GatewayCase

SUBPROTOCOLS = {REALTIME: "map.realtime", DEMO: "minicpmo.duplex"}
ADMITTED = ("session.queue_done", "queue_done")
ENDS = ("session.closed", "stopped", "timeout")
ANSWER_TIMEOUT_S = 30.0  # far past any answer: a connection still open then is a hang


@dataclass
class Answer:
    status: int | None = None  # the HTTP status of a refused handshake
    events: list[dict] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # every text message as it came
    ended: str = ""  # event | socket | timeout | refused | disconnected
    closed_by: str = ""  # how the socket closed, when it did

    def codes(self) -> list[str]:
        """The error codes that came before the session's end event."""
        codes = []
        for event in self.events:
            if event.get("type") in ENDS:
                break
            if event.get("type") == "error":
                codes.append(str(event.get("code") or (event.get("error") or {}).get("code")))
        return codes


def url_of(base: str, case: GatewayCase) -> str:
    if case.protocol == DEMO:
        return f"{base}/ws/duplex/{case.handshake.path_id}"
    mode = case.handshake.mode
    query = "model=fuzz" if mode == "omitted" else f"mode={urllib.parse.quote(mode)}&model=fuzz"
    return f"{base}/v1/realtime?{query}"


async def open_socket(base: str, case: GatewayCase, key: str) -> ClientConnection:
    shake = case.handshake
    protocols = {"right": [SUBPROTOCOLS[case.protocol]], "wrong": ["bogus.protocol"], "none": []}[shake.subprotocol]
    headers = {}
    if shake.key == "bearer":
        headers["Authorization"] = f"Bearer {key}"
    elif shake.key == "wrong":
        headers["Authorization"] = f"Bearer not-{key}"
    elif shake.key == "subprotocol":
        protocols = [*protocols, f"apikey.{key}"]
    origin = {"none": None, "own": base.replace("ws://", "http://"), "foreign": "http://evil.example"}[shake.origin]
    return await connect(url_of(base, case), additional_headers=headers, subprotocols=protocols or None,
                         origin=origin, max_size=None, open_timeout=ANSWER_TIMEOUT_S, close_timeout=5, compression=None)


def run_case(base: str, case: GatewayCase, key: str) -> Answer:
    return asyncio.run(_run_case(base, case, key))


async def _run_case(base: str, case: GatewayCase, key: str) -> Answer:
    answer = Answer()
    try:
        ws = await open_socket(base, case, key)
    except InvalidStatus as err:
        answer.status, answer.ended = err.response.status_code, "refused"
        answer.raw.append(err.response.body.decode("utf-8", "replace") if err.response.body else "")
        return answer
    async with ws:
        if not await _until(ws, answer, ADMITTED + ("error",)):
            return answer
        if any(event.get("type") == "error" for event in answer.events):
            await _until(ws, answer, ENDS)
            return answer
        await _send(ws, case)
        if case.disconnect:
            _drop(ws)
            answer.ended = "disconnected"
            return answer
        await _until(ws, answer, ENDS)
    return answer


async def _send(ws: ClientConnection, case: GatewayCase) -> None:
    for frame in case.frames:
        try:
            await ws.send(frame.data.encode("latin-1") if frame.effect == "binary" else frame.data)
        except ConnectionClosed:
            return


async def _until(ws: ClientConnection, answer: Answer, kinds: tuple[str, ...]) -> bool:
    """Read messages until one of `kinds`; False when the socket closed or nothing came in time."""
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        try:
            text = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            answer.ended = "timeout"
            return False
        except ConnectionClosed as err:
            answer.ended, answer.closed_by = "socket", str(err)
            return False
        text = text if isinstance(text, str) else text.decode("utf-8", "replace")
        answer.raw.append(text)
        event = json.loads(text)
        answer.events.append(event)
        if event.get("type") in kinds:
            answer.ended = "event"
            return True


def _drop(ws: ClientConnection) -> None:
    """An abrupt disconnect: the TCP connection goes without a close frame."""
    sock = ws.transport.get_extra_info("socket")
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    ws.transport.abort()
