"""The admission queue: at most `capacity` sessions hold the server (the `duplex` model's
max_sessions, read from the server: capacity.py); past that, connections wait in order, are told
their position and estimated wait whenever the queue moves, and are handed a slot as one frees.
The queue is bounded: past `max_waiting` a connection is refused (`QueueFull`).

The estimated wait is position x the mean time a session holds its slot / capacity, the mean
taken over recent sessions (an exponential average, `initial_session_s` before any ended).
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

SESSION_MEAN_WEIGHT = 0.2  # weight of the newest session in the mean hold time


class QueueFull(Exception):
    """The queue holds `max_waiting` connections already."""


@dataclass(frozen=True, slots=True)
class QueueStatus:
    position: int  # 1 = next to be admitted
    queue_length: int
    estimated_wait_s: float


@dataclass(slots=True)
class Slot:
    """A held admission; `release` it exactly once (AdmissionQueue.release is idempotent per slot)."""

    admitted_at: float
    waited_s: float
    released: bool = False


@dataclass
class AdmissionQueue:
    capacity: int
    max_waiting: int
    initial_session_s: float = 60.0
    active: int = 0
    _waiting: deque = field(default_factory=deque)  # futures, oldest first
    _moved: asyncio.Event = field(default_factory=asyncio.Event)
    _mean_session_s: float | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def admit(self, on_status: Callable[[QueueStatus], Awaitable[None]]) -> Slot:
        """A slot at once if one is free and nobody waits; else wait in line, calling
        `on_status` first and at every move. Raises QueueFull past the bound."""
        asked = time.monotonic()
        if self.active < self.capacity and not self._waiting:
            self.active += 1
            return Slot(asked, 0.0)
        if len(self._waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self._waiting)} connections wait already (the bound)")
        ticket: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append(ticket)
        try:
            await self._wait_turn(ticket, on_status)
        except BaseException:
            self._leave(ticket)
            raise
        return Slot(time.monotonic(), time.monotonic() - asked)

    def release(self, slot: Slot) -> None:
        """Free the slot and hand it to the oldest waiter."""
        if slot.released:
            return
        slot.released = True
        self.active -= 1
        held = time.monotonic() - slot.admitted_at
        mean = self._mean_session_s
        self._mean_session_s = held if mean is None else mean + SESSION_MEAN_WEIGHT * (held - mean)
        self._hand_over()

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity
        self._hand_over()

    def status_of(self, ticket: asyncio.Future) -> QueueStatus:
        position = self._waiting.index(ticket) + 1
        mean = self._mean_session_s if self._mean_session_s is not None else self.initial_session_s
        return QueueStatus(position, len(self._waiting), round(position * mean / max(self.capacity, 1), 1))

    async def _wait_turn(self, ticket: asyncio.Future, on_status: Callable[[QueueStatus], Awaitable[None]]) -> None:
        while not ticket.done():
            moved = self._moved
            await on_status(self.status_of(ticket))
            waiter = asyncio.ensure_future(moved.wait())
            await asyncio.wait({ticket, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()

    def _hand_over(self) -> None:
        handed = False
        while self._waiting and self.active < self.capacity:
            self._waiting.popleft().set_result(None)
            self.active += 1
            handed = True
        if handed:
            self._signal_move()

    def _leave(self, ticket: asyncio.Future) -> None:
        """A waiter gave up; a slot handed to it meanwhile is passed on."""
        if ticket in self._waiting:
            self._waiting.remove(ticket)
            self._signal_move()
        elif ticket.done() and not ticket.cancelled():
            self.active -= 1
            self._hand_over()

    def _signal_move(self) -> None:
        """Wake every waiter (positions changed): a fresh event for the next move."""
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
