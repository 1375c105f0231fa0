"""Tests for client/streaming.py.

Strategy: run `stream_utterance` end to end against `FakeTritonClient` at several times real
time (so each test takes a fraction of a second) with scripted server replies, then check the
report (turns, silence streamed, errors), what went on the wire, and the pacing. Failure paths
(refused START, error events, no reply, no session.created) must end in a report with errors,
never a hang.
"""

import numpy as np
import pytest

from client.events import AudioDelta, ResponseDone, SessionClosed, SessionCreated
from client.params import SessionParams
from client.session import DuplexSession
from client.streaming import StreamConfig, stream_utterance

ONE_SECOND = (np.arange(16000) % 200 - 100).astype(np.int16)  # [16000] int16, 5 appends
CHUNK = np.full(4800, 7, dtype=np.int16)  # 200 ms at 24 kHz


def appends(fake) -> list:
    return [r for r in fake.uplink_requests() if fake.action_of(r) == "append"]


def reply_on_append(number: int, *, error_first: bool = False):
    """A server script: answer with a two-chunk response when append `number` arrives, before
    the append returns (the streamer checks for the reply's end right after its next deadline:
    a fixed number of appends must not depend on how fast the fake's thread runs)."""

    def script(fake, request):
        count = len(appends(fake))
        if error_first and count == 1 and fake.action_of(request) == "append":
            fake.emit({"type": "error", "code": "INVALID_ARG", "message": "odd audio"})
        if count != number or fake.action_of(request) != "append":
            return
        fake.emit({"type": "response.created", "response_id": "r1", "turn_id": 0})
        for index, ttfp in enumerate((150.0, None)):
            extra = {} if ttfp is None else {"ttfp_ms": ttfp}
            fake.emit({"type": "response.audio.delta", "response_id": "r1", "turn_id": 0,
                       "text": "hi" if index else "", "audio_ms": 200 * (index + 1), **extra},
                      CHUNK)
        fake.emit({"type": "response.done", "response_id": "r1", "status": "completed"})
        fake.flush()

    return script


def run(fake, pcm=ONE_SECOND, **config):
    events = []
    with DuplexSession(fake, "sess") as session:
        report = stream_utterance(session, pcm, SessionParams(seed=1), StreamConfig(**config),
                                  on_event=events.append)
        reply = session.reply_audio()
    return report, events, reply


def test_reply_during_input(fake_client_factory):
    fake = fake_client_factory(on_request=reply_on_append(3))
    report, events, reply = run(fake, speed=10.0)
    (turn,) = report.turns
    assert (turn.response_id, turn.status, turn.num_chunks) == ("r1", "completed", 2)
    assert turn.server_ttfp_ms == 150.0 and turn.audio_ms == 400.0
    assert 0.0 <= turn.client_ttfp_ms <= turn.client_ttft_ms
    assert report.silence_ms == 0.0 and report.input_ms == 1000.0
    assert report.errors == () and report.ok and report.closed_cleanly
    assert report.reply_audio_ms == 400.0
    np.testing.assert_array_equal(reply, np.concatenate([CHUNK, CHUNK]))
    sent = np.concatenate([fake.audio_of(r) for r in appends(fake)])
    np.testing.assert_array_equal(sent, ONE_SECOND)
    assert fake.requests[-1].parameters["sequence_end"].bool_param
    assert type(events[0]) is SessionCreated and type(events[-1]) is SessionClosed
    assert sum(type(e) is AudioDelta for e in events) == 2


def test_appends_are_paced_on_absolute_deadlines(fake_client_factory):
    """Append n leaves at t0 + n * period or later, t0 being taken once session.created was
    read: never early, whatever the machine delays (a late first append moves no deadline)."""
    fake = fake_client_factory(on_request=reply_on_append(3))
    _, events, _ = run(fake, speed=10.0)
    period_s = 0.2 / 10.0
    created_s = next(e.received_s for e in events if type(e) is SessionCreated)  # <= t0
    times = [fake.request_times[fake.requests.index(r)] for r in appends(fake)]
    assert len(times) == 5
    for index, sent_s in enumerate(times):
        assert sent_s >= created_s + index * period_s, (index, created_s, times)


def test_silence_is_streamed_until_the_reply_is_done(fake_client_factory):
    fake = fake_client_factory(on_request=reply_on_append(7))  # 5 input + 2 silence appends
    report, _, _ = run(fake, speed=4.0)
    assert report.silence_ms == 400.0
    assert len(appends(fake)) == 7
    assert np.all(fake.audio_of(appends(fake)[-1]) == 0)
    assert report.ok and len(report.turns) == 1


def test_gives_up_after_max_seconds_of_silence(fake_client_factory):
    fake = fake_client_factory()
    report, _, _ = run(fake, speed=20.0, max_seconds=0.6)
    assert report.silence_ms == 600.0 and len(appends(fake)) == 5 + 3
    assert report.turns == () and not report.ok
    assert any("no finished response after 0.6 s" in error for error in report.errors)
    assert report.closed_cleanly  # the session still ends properly


def test_error_event_is_reported(fake_client_factory):
    fake = fake_client_factory(on_request=reply_on_append(2, error_first=True))
    report, _, _ = run(fake, speed=10.0)
    assert report.errors == ("error event INVALID_ARG: odd audio",)
    assert not report.ok and len(report.turns) == 1


def test_refused_start_ends_in_a_report_without_end(fake_client_factory):
    fake = fake_client_factory(refuse_start="admission limit reached (4 sessions)")
    report, _, _ = run(fake)
    assert report.errors == ("error event resource_exhausted: admission limit reached (4 sessions)",)
    # The server ended the refused START's sequence: an END would be a request Triton refuses.
    assert [request.id for request in fake.requests] == ["downlink"]
    assert not report.ok and not report.closed_cleanly and fake.stop_calls[0] is False


def test_start_failed_by_triton_sends_no_end(fake_client_factory):
    fake = fake_client_factory(fail_start="no sequence slot")
    report, _, _ = run(fake)
    assert report.errors == ("request failed: no sequence slot",)
    assert [request.id for request in fake.requests] == ["downlink"]


def test_missing_session_created_times_out(fake_client_factory):
    fake = fake_client_factory(send_created=False)
    report, _, _ = run(fake, created_timeout_s=0.05)
    assert len(report.errors) == 1 and report.errors[0].startswith("DuplexTimeout")
    assert fake.stop_calls[0] is True  # unsettled: cancelled, not joined


def test_done_without_audio_is_a_turn_without_audio(fake_client_factory):
    def script(fake, request):
        if len(appends(fake)) == 1 and fake.action_of(request) == "append":
            fake.emit({"type": "response.created", "response_id": "r0"})
            fake.emit({"type": "response.done", "response_id": "r0", "status": "cancelled"})
            fake.flush()

    report, events, _ = run(fake_client_factory(on_request=script), speed=20.0)
    (turn,) = report.turns
    assert turn.status == "cancelled" and turn.rtf is None and turn.num_chunks == 0
    assert not report.ok  # no audio at all
    assert any(type(e) is ResponseDone for e in events)


def test_rejects_non_pcm16_input(fake_client_factory):
    session = DuplexSession(fake_client_factory(), "s")
    with pytest.raises(ValueError, match="int16"):
        stream_utterance(session, ONE_SECOND.astype(np.float32))
    session.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"append_ms": 0}, "append_ms"),
        ({"speed": 0.0}, "speed"),
        ({"max_seconds": -1.0}, "max_seconds"),
        ({"close_timeout_s": 0.0}, "timeouts"),
    ],
)
def test_stream_config_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StreamConfig(**kwargs)
