"""The orchestrator's stage-call latency (backends/serving/metrics_stage_calls.py).

Strategy: a fake clock and fake stage clients whose results arrive at known times; each call
must be observed once, at its first result, under its stage's label, and the results pass
through unchanged; a caller that stops early must close the wrapped iterator (the gRPC
clients end their stream there), a call that fails before its first result observes nothing,
and the switch decides whether the orchestrator's clients are wrapped at all. The same switch
has a stage model (a real StageAdapter over a fake pb_utils) time each request's arrival from
its `sent_ns` parameter and each response's send. On a real server:
tests/server/test_metrics_server.py.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from test_metrics_duplex import Clock  # the sibling module's scripted clock

from backends.contracts.messages import TalkerRequest, stop_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving.metrics_catalog import STAGE_ARRIVAL, STAGE_CALL, STAGE_SEND
from backends.serving.metrics_stage_calls import (
    CALL_METRICS_ENV, SENT_NS_PARAMETER, MeteredStageClients, sent_ns_of, with_call_metrics,
)
from backends.serving.triton_stage import StageAdapter


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, dict]] = []

    def observe(self, spec, value: float, **labels: str) -> None:
        self.seen.append((spec.name, round(value, 6), labels))


class FakeStages:
    """Results that take 20 ms to the first and 5 ms to each next; records what happened."""

    def __init__(self, clock: Clock, fail: bool = False) -> None:
        self.clock, self.fail = clock, fail
        self.closed: list[str] = []
        self.stops: list[tuple[str, str]] = []

    def _stream(self, stage: str, items: list) -> Iterator:
        try:
            for i, item in enumerate(items):
                self.clock.now += 0.020 if i == 0 else 0.005
                if self.fail:
                    raise RuntimeError(f"{stage} failed")
                yield item
        finally:
            self.closed.append(stage)

    def thinker(self, request) -> Iterator:
        return self._stream("thinker", ["unit0", "unit1"])

    def talker(self, request) -> Iterator:
        return self._stream("talker", ["codes0", "codes1", "codes2"])

    def code2wav(self, request) -> list:
        self.clock.now += 0.015
        return ["audio"]

    def stop(self, stage: str, request_id: str) -> None:
        self.stops.append((stage, request_id))


@pytest.fixture
def parts():
    clock = Clock()
    stages, metrics = FakeStages(clock), Recorder()
    return clock, stages, metrics, MeteredStageClients(stages, metrics, clock)


def test_each_call_is_observed_once_at_its_first_result(parts):
    clock, stages, metrics, metered = parts
    assert list(metered.thinker(object())) == ["unit0", "unit1"]
    assert list(metered.talker(object())) == ["codes0", "codes1", "codes2"]
    assert metered.code2wav(object()) == ["audio"]
    metered.stop("talker", "r1")
    assert metrics.seen == [(STAGE_CALL.name, 20.0, {"stage": "thinker"}),
                            (STAGE_CALL.name, 20.0, {"stage": "talker"}),
                            (STAGE_CALL.name, 15.0, {"stage": "code2wav"})]
    assert stages.stops == [("talker", "r1")] and stages.closed == ["thinker", "talker"]


def test_the_clock_starts_when_the_call_is_made_not_when_it_is_read(parts):
    clock, _, metrics, metered = parts
    results = metered.talker(object())
    clock.now += 0.100  # the caller reads its results later
    next(results)
    assert metrics.seen[0][1] == 120.0


def test_stopping_early_closes_the_wrapped_iterator(parts):
    _, stages, metrics, metered = parts
    results = metered.talker(object())
    assert next(results) == "codes0"
    results.close()
    assert stages.closed == ["talker"] and len(metrics.seen) == 1


def test_a_call_that_fails_first_observes_nothing():
    clock = Clock()
    stages, metrics = FakeStages(clock, fail=True), Recorder()
    with pytest.raises(RuntimeError, match="thinker failed"):
        list(MeteredStageClients(stages, metrics, clock).thinker(object()))
    assert metrics.seen == [] and stages.closed == ["thinker"]


def test_the_switch_decides_whether_calls_are_metered():
    stages, metrics = FakeStages(Clock()), Recorder()
    assert with_call_metrics(stages, metrics, {}) is stages
    assert with_call_metrics(stages, metrics, {CALL_METRICS_ENV: "0"}) is stages
    assert isinstance(with_call_metrics(stages, metrics, {CALL_METRICS_ENV: "1"}), MeteredStageClients)
    with pytest.raises(ValueError, match=CALL_METRICS_ENV):  # a typo is refused, not read as off
        with_call_metrics(stages, metrics, {CALL_METRICS_ENV: "true"})


def test_a_request_s_send_time_is_read_from_its_parameters():
    assert sent_ns_of(json.dumps({SENT_NS_PARAMETER: 123, "other": "x"})) == 123
    for parameters in ("", "{}", "not json", "[1]", json.dumps({SENT_NS_PARAMETER: "123"}),
                       json.dumps({SENT_NS_PARAMETER: True}), json.dumps({SENT_NS_PARAMETER: 1.5})):
        assert sent_ns_of(parameters) is None, parameters


class AnswerAtOnce:
    """An engine that ends each request as it arrives (the `stop` requests below never reach
    it: the adapter answers those itself)."""

    def submit(self, request, sink) -> None:
        sink.close()

    def stop(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return False

    def step(self) -> None:
        pass


AGO_MS = 5.0


def _stop_request(pb, parameters: dict) -> object:
    request = pb.request_from_arrays(to_arrays(stop_request("talker", "r.e0")))
    request.parameters_json = json.dumps(parameters)
    return request


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_stage_times_a_request_s_arrival_and_its_response_s_send(pb, monkeypatch, switch):
    monkeypatch.setenv(CALL_METRICS_ENV, switch)
    adapter = StageAdapter(pb, "talker", TalkerRequest, AnswerAtOnce())
    started_ns = time.monotonic_ns()
    sent_ns = started_ns - int(AGO_MS * 1e6)
    sent = [_stop_request(pb, {SENT_NS_PARAMETER: sent_ns}),
            _stop_request(pb, {})]  # a client other than the orchestrator: no send time
    adapter.execute(sent)
    assert all(request.sender.done.wait(30) for request in sent)
    adapter.finalize()  # flushes the metrics thread
    ended_ns = time.monotonic_ns()  # everything measured happened before this
    assert [r.sender.sent for r in sent] == [[(None, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]] * 2
    arrivals, sends = pb.observed(STAGE_ARRIVAL.name, model="talker"), pb.observed(STAGE_SEND.name, model="talker")
    if switch == "0":
        assert arrivals == [] and sends == []
        return
    assert len(arrivals) == 1 and AGO_MS <= arrivals[0] <= (ended_ns - sent_ns) / 1e6, arrivals
    assert len(sends) == 2 and all(0 <= ms <= (ended_ns - started_ns) / 1e6 for ms in sends), sends
