"""The two loops of an open session: client commands to duplex requests, downlink events to
client messages. Ends when the server closes the session; a client that asked to close, went
away or broke the protocol (where its protocol ends the session on errors) gets an END, and
the loops wait for the server's close, up to the drain timeout, before the stream is cancelled."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from backends.gateway.commands import Append, Close, Command, Ignore, Init, Pause, Resume
from backends.gateway.duplex_stream import DuplexEvent, DuplexStream
from backends.gateway.errors import INVALID_EVENT, RATE_LIMITED, ClientGone, GatewayError
from backends.gateway.rate import InputRate

if TYPE_CHECKING:
    from backends.gateway.bridge import Bridge

KEEPALIVE_S = 10.0  # a paused session's empty appends keep the server's idle timer from closing it


class Uplink:
    def __init__(self, bridge: "Bridge", stream: DuplexStream) -> None:
        self.bridge, self.stream = bridge, stream
        self.rate = InputRate(bridge.state.config.rate_slack_s)
        self.paused: asyncio.Task | None = None

    def end(self) -> None:
        self._stop_pause()
        self.stream.end()

    async def run(self) -> None:
        down = asyncio.ensure_future(self._downlink())
        up = asyncio.ensure_future(self._uplink())
        try:
            await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
            if not down.done():
                await self._drain(down)
        except BaseException:
            up.cancel()
            raise
        finally:
            self._stop_pause()
            if not down.done():
                self.stream.abort()
                await asyncio.gather(down, return_exceptions=True)
        reason = down.result() if not down.cancelled() and down.exception() is None else "error"
        # The server closed the session: the stream ends without an END (Triton would refuse an
        # END of a closed sequence and count it in flight until it stops).
        self.stream.release()
        await self.bridge.send_closed(self.bridge.context.close_reason or reason)
        await self.bridge.close_socket()  # the client's messages end: so does the uplink
        await asyncio.gather(up, return_exceptions=True)

    async def _drain(self, down: asyncio.Future) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(down), self.bridge.state.config.drain_timeout_s)
        except asyncio.TimeoutError:
            self.stream.abort()
            await asyncio.gather(down, return_exceptions=True)

    async def _downlink(self) -> str:
        """Client messages of every event; the server's close reason."""
        async for event in self.stream.downlink:
            self._account(event)
            if event.type == "session.closed":
                return str(event.fields.get("reason", "error"))
            for message in self.bridge.codec.events(event):
                await self.bridge.send(message)
        return "error"

    def _account(self, event: DuplexEvent) -> None:
        usage = self.bridge.context.usage
        if event.audio is not None:
            usage.add_output_audio(int(event.audio.size))
        if event.type == "response.text.delta":
            usage.add_text(event.fields)

    async def _uplink(self) -> None:
        while True:
            try:
                if not await self._apply(await self.bridge.receive()):
                    return
            except ClientGone:
                self.end()
                return
            except GatewayError as err:
                await self.bridge.send_error(err)
                if self.bridge.codec.errors_end_session:
                    self.bridge.context.close_reason = "error"
                    self.end()
                    return

    async def _apply(self, command: Command) -> bool:
        """Carry out one command; False when the uplink is over."""
        if isinstance(command, Append):
            self._append(command)
        elif isinstance(command, Close):
            self.bridge.context.close_reason = command.reason
            self.end()
            return False
        elif isinstance(command, Pause):
            await self._pause()
        elif isinstance(command, Resume):
            await self._resume()
        elif isinstance(command, Init):
            raise GatewayError(INVALID_EVENT, "the session is initialized already")
        elif not isinstance(command, Ignore):
            raise GatewayError(INVALID_EVENT, f"unexpected {type(command).__name__}")
        return True

    def _append(self, command: Append) -> None:
        if self.paused is not None:
            return  # audio of a paused session is not the model's input
        samples = int(command.pcm16.size)
        if not self.rate.admit(samples):
            raise GatewayError(RATE_LIMITED, f"input audio may run at most {self.rate.slack_s:g} s ahead of real time")
        context = self.bridge.context
        context.usage.add_input(samples)
        context.clock.sent(samples)
        self.stream.append(command.pcm16, "cancel" if command.interrupt else "append")

    async def _pause(self) -> None:
        if self.paused is None:
            self.paused = asyncio.ensure_future(self._keep_paused())
        await self.bridge.send(self.bridge.codec.paused())

    async def _resume(self) -> None:
        self._stop_pause()
        self.rate.restart()
        await self.bridge.send(self.bridge.codec.resumed())

    async def _keep_paused(self) -> None:
        """Keep the paused session open, up to the pause timeout; then end it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bridge.state.config.pause_timeout_s
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(KEEPALIVE_S, left))
            self.stream.append(np.zeros(0, np.int16))
        self.bridge.context.close_reason = "timeout"
        self.paused = None
        self.stream.end()

    def _stop_pause(self) -> None:
        if self.paused is not None and self.paused is not asyncio.current_task():
            self.paused.cancel()
        self.paused = None
