"""Refused STARTs free their sequence before they are answered, off the uplink thread; a
START of an open session's id leaves that sequence alone; an END always ends its session.

Strategy: a downlink that logs the order of `abandon`, `send` and `close` (abandon stands for
the orchestrator's own END of the sequence, which in Triton is a round trip through the
server that calls `handle`); one whose abandon blocks shows that `handle` does not wait for it.
"""
from __future__ import annotations

import threading

import pytest
from scripted_stages import RecordingDownlink, ScriptedStages, send, wait_for

from backends.duplex.session_manager import ManagerConfig, SessionManager


class OrderedDownlink(RecordingDownlink):
    """Logs the calls in order; `abandon` waits for `release_gate` (set by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.release_gate = threading.Event()
        self.release_gate.set()

    def abandon(self) -> None:
        assert self.release_gate.wait(10), "the release was never let through"
        self.calls.append("abandon")
        super().abandon()

    def send(self, event) -> None:
        self.calls.append(f"send:{event.type}")
        super().send(event)

    def close(self) -> None:
        self.calls.append("close")
        super().close()


@pytest.fixture
def manager():
    manager = SessionManager(ManagerConfig(max_sessions=1), ScriptedStages())
    yield manager
    manager.shutdown()


@pytest.mark.parametrize("params, code", [({}, "resource_exhausted"), ({"reply_units": -1}, "invalid_argument")])
def test_a_refused_start_frees_its_sequence_before_the_answer(manager, params, code):
    send(manager, "open", start=True)
    refused = OrderedDownlink()
    send(manager, "other", start=True, downlink=refused, **params)
    wait_for(refused.closed.is_set, "the refusal")
    assert refused.calls == ["abandon", "send:error", "close"]
    assert refused.events[0].fields["code"] == code


def test_a_refused_start_that_carries_end_is_not_released_again(manager):
    send(manager, "open", start=True)
    refused = OrderedDownlink()
    send(manager, "other", start=True, end=True, downlink=refused)  # Triton ended it with this request
    assert refused.calls == ["send:error", "close"]


def test_the_uplink_thread_does_not_wait_for_the_release(manager):
    send(manager, "open", start=True)
    refused = OrderedDownlink()
    refused.release_gate.clear()
    send(manager, "other", start=True, downlink=refused)  # returns while the release is held
    assert refused.calls == [] and not refused.closed.is_set()
    _, reply = send(manager, "open", 16000)  # the next uplink is served meanwhile
    assert reply.result == "ok"
    refused.release_gate.set()
    wait_for(refused.closed.is_set, "the refusal after the release")
    assert refused.calls == ["abandon", "send:error", "close"]


def test_a_start_for_an_open_session_leaves_its_sequence_alone(manager):
    first, _ = send(manager, "s", start=True)
    dup = OrderedDownlink()
    send(manager, "s", start=True, downlink=dup)
    assert dup.calls == ["send:error", "close"] and dup.events[0].fields["code"] == "session_exists"
    _, reply = send(manager, "s", 16000)
    assert reply.result == "ok" and not first.closed.is_set()


def test_a_start_after_the_client_end_of_a_flushing_session_is_released():
    stages = ScriptedStages()
    stages.gate.clear()  # the ended session is still flushing its unit
    manager = SessionManager(ManagerConfig(), stages)
    send(manager, "s", start=True)
    send(manager, "s", 16000, end=True)  # Triton's sequence ended with this request
    retry = OrderedDownlink()
    send(manager, "s", start=True, downlink=retry)  # a new sequence in Triton: it must be freed
    wait_for(retry.closed.is_set, "the refusal")
    assert retry.calls == ["abandon", "send:error", "close"]
    assert retry.events[0].fields["code"] == "session_exists"
    stages.gate.set()
    manager.shutdown()


def test_a_start_retried_with_the_same_id_after_its_refusal_is_created(manager):
    first, _ = send(manager, "a", start=True)
    refused, _ = send(manager, "b", start=True)
    wait_for(refused.closed.is_set, "the refusal")
    send(manager, "a", end=True)
    wait_for(first.closed.is_set, "the first session closed")
    retried, _ = send(manager, "b", start=True)
    assert retried.types() == ["session.created"] and not retried.abandoned


def test_an_end_with_bad_parameters_still_ends_the_session(manager):
    down, _ = send(manager, "s", start=True)
    _, reply = send(manager, "s", end=True, action="dance")
    assert reply.result.code == "invalid_argument"
    wait_for(down.closed.is_set, "the session closed")
    assert down.events[-1].fields["reason"] == "client" and not down.abandoned


def test_shutdown_answers_the_refusals_still_queued():
    manager = SessionManager(ManagerConfig(max_sessions=1), ScriptedStages())
    send(manager, "open", start=True)
    refused = OrderedDownlink()
    refused.release_gate.clear()
    send(manager, "other", start=True, downlink=refused)
    threading.Timer(0.2, refused.release_gate.set).start()
    manager.shutdown()
    assert refused.closed.is_set() and refused.calls == ["abandon", "send:error", "close"]


def test_a_start_after_shutdown_is_still_answered():
    manager = SessionManager(ManagerConfig(), ScriptedStages())
    manager.shutdown()
    late = OrderedDownlink()
    send(manager, "late", start=True, downlink=late)
    assert late.calls == ["send:error", "close"] and late.events[0].fields["code"] == "resource_exhausted"
