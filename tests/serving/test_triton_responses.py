"""TritonSink and ResponseThread: every request ends with exactly one FINAL that its caller
can receive.

A sink that already sent data ends an error close with a flags-only FINAL (2.51's BLS drops an
error response that is not the request's first, and the FINAL on it; the stages keep the rule
for every caller); a FINAL whose send fails is retried without its response. A fake sender
records what would reach the server.
"""
from __future__ import annotations

import threading
import time

import pytest

from backends.contracts.errors import StageError
from backends.serving.triton_responses import ResponseThread, TritonSink

FINAL = 1
STOPPED = StageError("cancelled", "request r was stopped")


@pytest.fixture
def responses(pb):
    thread = ResponseThread(pb, "test-responses")
    yield thread
    thread.shutdown()


def _sink(pb, responses, sender) -> TritonSink:
    return TritonSink(pb, sender, responses, lambda result: pb.InferenceResponse())


WAIT_S = 30.0  # a bound for what happens at once


def _sent(sender) -> list[tuple[str, int]]:
    assert sender.done.wait(WAIT_S), "no FINAL"
    kinds = {True: "error", False: "data"}
    return [("none" if r is None else kinds[r.has_error()], flags) for r, flags in sender.sent]


def test_an_error_before_any_data_travels_on_the_final(pb, responses):
    sender = pb.Sender()
    _sink(pb, responses, sender).close(STOPPED)
    assert _sent(sender) == [("error", FINAL)]
    assert sender.sent[0][0].error().message() == "[cancelled] request r was stopped"


def test_an_error_after_data_ends_with_a_plain_final(pb, responses):
    sender = pb.Sender()
    sink = _sink(pb, responses, sender)
    sink.send(object())
    sink.close(STOPPED)
    sink.close(StageError("internal", "closed twice"))  # idempotent: one FINAL only
    assert _sent(sender) == [("data", 0), ("none", FINAL)]


def test_a_completed_request_ends_with_a_plain_final(pb, responses):
    sender = pb.Sender()
    sink = _sink(pb, responses, sender)
    sink.send(object())
    sink.close()
    assert _sent(sender) == [("data", 0), ("none", FINAL)]


def test_a_finished_request_sends_its_last_result_on_the_final(pb, responses):
    sender = pb.Sender()
    sink = _sink(pb, responses, sender)
    sink.send(object())
    sink.finish(object())
    sink.close()  # idempotent after finish: nothing more goes
    assert _sent(sender) == [("data", 0), ("data", FINAL)]
    with pytest.raises(RuntimeError, match="after FINAL"):
        sink.finish(object())


def test_a_result_that_fails_to_encode_leaves_the_sink_open_for_its_error(pb, responses):
    sender = pb.Sender()

    def refuse(result):
        raise ValueError("cannot encode")

    sink = TritonSink(pb, sender, responses, refuse)
    with pytest.raises(ValueError):
        sink.finish(object())
    sink.close(STOPPED)
    assert _sent(sender) == [("error", FINAL)]


class RefusingSender:
    """The server refuses a response (e.g. it cannot be serialized); a plain FINAL goes."""

    def __init__(self, pb) -> None:
        self.inner = pb.Sender()

    def send(self, response=None, flags: int = 0) -> None:
        if response is not None:
            raise RuntimeError("response refused")
        self.inner.send(flags=flags)


def test_a_final_whose_response_is_refused_still_ends_the_request(pb, responses):
    sender = RefusingSender(pb)
    _sink(pb, responses, sender).close(STOPPED)
    assert _sent(sender.inner) == [("none", FINAL)]


def test_a_refused_last_result_still_ends_the_request(pb, responses):
    sender = RefusingSender(pb)
    _sink(pb, responses, sender).finish(object())
    assert _sent(sender.inner) == [("none", FINAL)]


class SlowSender:
    """The server takes SLOW_S to accept each response, and accepts none before `open`."""

    def __init__(self, pb) -> None:
        self.inner = pb.Sender()
        self.open = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        assert self.open.wait(WAIT_S)
        time.sleep(SLOW_S)
        self.inner.send(response, flags)


SLOW_S = 0.02


def test_each_response_s_send_time_is_reported(pb):
    seconds: list[float] = []
    thread = ResponseThread(pb, "timed-responses", on_sent=seconds.append)
    sender = SlowSender(pb)
    sink = TritonSink(pb, sender, thread, lambda result: pb.InferenceResponse())
    sink.send(object())
    sink.finish(object())
    sender.open.set()  # both are queued before the first send starts
    assert _sent(sender.inner) == [("data", 0), ("data", FINAL)]
    thread.shutdown()
    assert len(seconds) == 2 and seconds[0] >= SLOW_S, seconds
    assert seconds[1] >= 2 * SLOW_S, "the second waited behind the first"
