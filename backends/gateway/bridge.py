"""The session bridge: one WebSocket connection <-> one duplex session, whatever the protocol.

admit (queue messages) -> the client's init -> START (session.created or a refusal) -> two
loops until the session ends: client messages to duplex requests (uplink) and downlink events
to client messages. The admission slot is held from admission until the server has closed the
session (or its stream is gone), so the gateway never admits more than the server holds.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from backends.gateway.admission import QueueFull, QueueStatus, Slot
from backends.gateway.commands import Close, Command, Ignore, Init
from backends.gateway.errors import (
    INIT_TIMEOUT, MESSAGE_TOO_LARGE, NOT_INITIALIZED, QUEUE_FULL, SERVER_SHUTDOWN, ClientGone, GatewayError,
)
from backends.gateway.gateway_state import GatewayState
from backends.gateway.session_context import SessionContext
from backends.gateway.session_open import open_session
from backends.gateway.uplink import Uplink

log = logging.getLogger("minicpmo.gateway")
SHUTDOWN_CLOSE_CODE = 1001  # "going away"
INBOX_MESSAGES = 16
CLOSING = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


class Bridge:
    def __init__(self, ws: web.WebSocketResponse, codec_type: Callable[[SessionContext], Any], state: GatewayState) -> None:
        self.ws, self.state = ws, state
        self.context = SessionContext(f"gw-{uuid.uuid4().hex[:16]}")
        self.codec = codec_type(self.context)
        self.uplink: Uplink | None = None
        self.task: asyncio.Task | None = None
        self.closed_told = False
        # One reader task owns the socket's receive for the connection's whole life (a cancelled
        # receive would leave the close waiting on the client); messages wait here, bounded so
        # that a flooding client is held back by TCP.
        self._inbox: asyncio.Queue = asyncio.Queue(maxsize=INBOX_MESSAGES)
        self._gone = asyncio.Event()
        self._reader: asyncio.Future | None = None

    # ---- sending -----------------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        if self.ws.closed:
            return
        text = json.dumps(message, ensure_ascii=False)
        try:
            await self.ws.send_str(text)
        except (ConnectionError, RuntimeError):
            return
        self.state.metrics.frame("out", len(text))
        if message.get("type") == "error":
            self.state.metrics.add("minicpmo_gateway_errors_total", code=str(message.get("code", "error")))

    async def send_error(self, err: GatewayError) -> None:
        await self.send(self.codec.error(err.code, err.message))

    async def send_closed(self, reason: str) -> None:
        if not self.closed_told:
            self.closed_told = True
            for message in self.codec.closed(reason):
                await self.send(message)

    # ---- receiving ---------------------------------------------------------------------------

    async def _read(self) -> None:
        """The connection's only reader of the socket, until it closes."""
        try:
            while (message := await self.ws.receive()).type not in CLOSING:
                await self._inbox.put(message)
        finally:
            self._gone.set()
            with contextlib.suppress(asyncio.QueueFull):
                self._inbox.put_nowait(None)

    async def receive(self) -> Command:
        """The next client command; GatewayError for a bad message, ClientGone at the end."""
        if self._gone.is_set() and self._inbox.empty():
            raise ClientGone()
        message = await self._inbox.get()
        if message is None:
            raise ClientGone()
        data = message.data if message.type == WSMsgType.TEXT else message.data.decode("utf-8", "replace")
        self.state.metrics.frame("in", len(data))
        if len(data) > self.state.config.max_message_bytes:
            raise GatewayError(MESSAGE_TOO_LARGE, f"a message is at most {self.state.config.max_message_bytes} bytes")
        return self.codec.parse(data)

    # ---- the connection ----------------------------------------------------------------------

    async def run(self) -> None:
        self.task = asyncio.current_task()
        self.state.live.add(self)
        reader = self._reader = asyncio.ensure_future(self._read())
        try:
            await self._admitted_session()
        except ClientGone:
            pass
        except asyncio.CancelledError:
            if not self.state.shutting_down:
                raise
            await self.send_closed(SERVER_SHUTDOWN)
        finally:
            self.state.live.discard(self)
            await self.close_socket()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def close_socket(self) -> None:
        """Close the WebSocket (1001 with the reason during a shutdown); idempotent. The reader
        stops first: while another task waits in receive(), aiohttp's close() drops the TCP
        connection without waiting for the client's close reply, and frames the client still
        has in flight then reset it, losing the messages sent just before (the error that ended
        the session). Without a pending receive, close() reads up to the client's reply (at most
        aiohttp's close timeout); a shutdown does not wait for slow clients."""
        shutting_down = self.state.shutting_down
        if not shutting_down and self._reader is not None and not self._reader.done():
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.ws.close(code=SHUTDOWN_CLOSE_CODE if shutting_down else 1000,
                            message=(SERVER_SHUTDOWN if shutting_down else "").encode())

    async def _admit(self) -> Slot:
        """An admission slot; ClientGone when the client leaves while it waits in line."""
        admit = asyncio.ensure_future(self.state.admission.admit(self._queued))
        gone = asyncio.ensure_future(self._gone.wait())
        await asyncio.wait({admit, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not admit.done():
            admit.cancel()
            await asyncio.gather(admit, return_exceptions=True)
            raise ClientGone()
        return admit.result()

    async def _admitted_session(self) -> None:
        try:
            slot = await self._admit()
        except QueueFull as err:
            self.state.metrics.add("minicpmo_gateway_refusals_total", reason=QUEUE_FULL)
            await self.send_error(GatewayError(QUEUE_FULL, str(err)))
            await self.send_closed("error")
            return
        finally:
            self.state.queue_gauges()
        self.state.metrics.add("minicpmo_gateway_queue_wait_seconds_sum", slot.waited_s)
        self.state.metrics.add("minicpmo_gateway_queue_wait_seconds_count")
        self.state.metrics.add("minicpmo_gateway_sessions", 1, protocol=self.codec.name)
        try:
            await self.send(self.codec.queue_done())
            init = await self._init()
            if init is None:
                await self.send_closed("error")  # told already when the client closed
            else:
                await self._session(init)
        finally:
            self.state.admission.release(slot)
            self.state.metrics.add("minicpmo_gateway_sessions", -1, protocol=self.codec.name)
            self.state.queue_gauges()

    async def _queued(self, status: QueueStatus) -> None:
        self.state.queue_gauges()
        await self.send(self.codec.queued(status))

    async def _init(self) -> Init | None:
        """The client's init message; None when the client closed or broke the protocol first.
        Past the init timeout the socket is closed (which ends the pending receive)."""
        timer = asyncio.get_running_loop().call_later(self.state.config.init_timeout_s,
                                                      lambda: asyncio.ensure_future(self._init_expired()))
        try:
            return await self._first_init()
        finally:
            timer.cancel()

    async def _init_expired(self) -> None:
        await self.send_error(GatewayError(INIT_TIMEOUT, "no session init in time"))
        await self.send_closed("error")
        await self.close_socket()

    async def _first_init(self) -> Init | None:
        while True:
            try:
                command = await self.receive()
            except GatewayError as err:
                await self.send_error(err)
                if self.codec.errors_end_session:
                    return None
                continue
            if isinstance(command, Init):
                return command
            if isinstance(command, Close):
                await self.send_closed(command.reason)
                return None
            if isinstance(command, Ignore):  # diagnostics need no session, before it as after
                continue
            await self.send_error(GatewayError(NOT_INITIALIZED, "send the session init first"))
            if self.codec.errors_end_session:
                return None

    async def _session(self, init: Init) -> None:
        self.context.not_applied = init.not_applied
        stream = await open_session(self, init)
        if stream is None:
            return
        self.uplink = Uplink(self, stream)
        await self.uplink.run()

    def shutdown(self) -> None:
        """Close for a server shutdown: a session ENDs (its downlink closes it), others stop."""
        self.context.close_reason = self.context.close_reason or SERVER_SHUTDOWN
        if self.uplink is not None:
            self.uplink.end()
        else:
            asyncio.ensure_future(self._close_unopened())

    async def _close_unopened(self) -> None:
        """A connection in the queue or before its session: told, closed, then stopped."""
        await self.send_closed(SERVER_SHUTDOWN)
        await self.close_socket()
        if self.task is not None:
            self.task.cancel()
