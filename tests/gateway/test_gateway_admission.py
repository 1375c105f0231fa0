"""The admission queue without a server: immediate admission under capacity, waiting in order
with positions and estimated waits, hand-over as slots free, the bound, a waiter that leaves."""
from __future__ import annotations

import asyncio

import pytest

from backends.gateway.admission import AdmissionQueue, QueueFull


def test_waiters_are_told_positions_and_handed_over_in_order():
    async def scenario():
        queue = AdmissionQueue(capacity=1, max_waiting=2, initial_session_s=30.0)
        seen: dict[str, list] = {"a": [], "b": []}

        async def told(name, status):
            seen[name].append((status.position, status.queue_length, status.estimated_wait_s))

        first = await queue.admit(lambda status: told("x", status))
        a = asyncio.ensure_future(queue.admit(lambda status: told("a", status)))
        b = asyncio.ensure_future(queue.admit(lambda status: told("b", status)))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await queue.admit(lambda status: told("x", status))
        queue.release(first)
        slot_a = await a
        await asyncio.sleep(0.01)
        assert not b.done() and queue.active == 1
        queue.release(slot_a)
        queue.release(slot_a)  # a second release changes nothing
        await b
        return queue, seen

    queue, seen = asyncio.run(scenario())
    assert seen["a"] == [(1, 1, 30.0)]  # told again only when the line ahead of it moves
    assert seen["b"][0] == (2, 2, 60.0) and seen["b"][-1][0] == 1
    assert queue.active == 1 and queue.waiting == 0


def test_a_waiter_that_leaves_frees_its_place():
    async def scenario():
        queue = AdmissionQueue(capacity=1, max_waiting=4)

        async def quiet(status):
            return None

        held = await queue.admit(quiet)
        leaving = asyncio.ensure_future(queue.admit(quiet))
        staying = asyncio.ensure_future(queue.admit(quiet))
        await asyncio.sleep(0.01)
        leaving.cancel()
        await asyncio.sleep(0.01)
        assert queue.waiting == 1
        queue.release(held)
        await staying
        return queue

    queue = asyncio.run(scenario())
    assert queue.active == 1 and queue.waiting == 0


def test_more_capacity_admits_waiters():
    async def scenario():
        queue = AdmissionQueue(capacity=0, max_waiting=4)

        async def quiet(status):
            return None

        waiter = asyncio.ensure_future(queue.admit(quiet))
        await asyncio.sleep(0.01)
        queue.set_capacity(2)
        await waiter
        return queue

    assert asyncio.run(scenario()).active == 1
