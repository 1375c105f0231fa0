"""Least-slack-first choice of Code2Wav windows (backends/stages/window_schedule.py)."""

from __future__ import annotations

from backends.stages.window_schedule import (
    LEAD_S, MAX_HINTS, Candidate, FirstWindowHints, PlayoutClock, held_for, pick,
)

NEVER = float("-inf")


def test_playout_clock_queues_audio_and_restarts_after_running_dry() -> None:
    clock = PlayoutClock()
    clock.sent(10.0, 1.0)
    clock.sent(10.2, 1.0)  # queued behind the first second
    assert clock.audio_end == 12.0
    clock.sent(15.0, 0.5)  # the client ran dry at 12: plays at once
    assert clock.audio_end == 15.5


def test_a_first_window_goes_before_streams_with_audio_queued() -> None:
    now = 100.0
    queued = [Candidate(f"busy{i}", waiting_since=99.0, audio_end=101.5 + i) for i in range(3)]
    first = Candidate("new", waiting_since=99.95, audio_end=NEVER)
    assert pick(queued + [first], now, max_batch=2) == ["new"]  # alone: a smaller, faster forward
    assert pick(queued, now, max_batch=2) == ["busy0", "busy1"]  # nothing due: a full batch


def test_streams_with_audio_queued_ride_along_only_in_the_due_ones_graph_bucket() -> None:
    now = 10.0
    due = [Candidate(f"due{i}", waiting_since=9.9 - i, audio_end=NEVER) for i in range(3)]
    queued = [Candidate(f"busy{i}", waiting_since=9.0, audio_end=12.0 + i) for i in range(3)]
    buckets = {1: 1, 2: 2, 3: 4, 4: 4}.__getitem__
    assert pick(due + queued, now, max_batch=8, fill_to=buckets) == ["due2", "due1", "due0", "busy0"]
    assert pick(due + queued, now, max_batch=2, fill_to=buckets) == ["due2", "due1"]
    assert pick(due[:1] + queued, now, max_batch=8, fill_to=buckets) == ["due0"]


def test_a_client_about_to_run_dry_is_due() -> None:
    now = 5.0
    low = Candidate("low", waiting_since=4.0, audio_end=now + LEAD_S - 0.01)  # under the lead left
    ample = Candidate("ample", waiting_since=3.0, audio_end=now + 2.0)
    assert pick([ample, low], now, max_batch=8) == ["low"]


def test_streams_with_nothing_to_play_go_longest_waiting_first() -> None:
    now = 50.0
    dry = [Candidate("a", 49.9, NEVER), Candidate("b", 49.5, 48.3), Candidate("c", 49.7, NEVER)]
    # b's audio was due before its window arrived: it has waited since 49.5, not since 47.8
    assert pick(dry, now, max_batch=3) == ["b", "c", "a"]


def test_queued_audio_grows_urgent_so_no_stream_starves() -> None:
    busy = Candidate("busy", waiting_since=0.0, audio_end=2.0)  # 2 s of audio at the client
    served_at = None
    for tick in range(40):  # a new first window arrives every 0.1 s and waits its turn
        now = 0.1 * tick
        fresh = Candidate(f"new{tick}", waiting_since=now, audio_end=NEVER)
        if pick([busy, fresh], now, max_batch=1) == ["busy"]:
            served_at = now
            break
    assert served_at is not None and served_at <= 2.0 - LEAD_S  # due before the client runs dry


def test_at_most_max_batch() -> None:
    many = [Candidate(str(i), float(i), NEVER) for i in range(10)]
    assert pick(many, 20.0, max_batch=8) == [str(i) for i in range(8)]
    assert pick([], 0.0, max_batch=8) == []


def test_held_for_waits_no_longer_than_the_hold_nor_past_the_first_due_window() -> None:
    now = 10.0
    ample = Candidate("ample", waiting_since=9.0, audio_end=now + LEAD_S + 2.0)  # 2 s of slack
    soon = Candidate("soon", waiting_since=9.0, audio_end=now + LEAD_S + 0.01)  # 10 ms of slack
    due = Candidate("due", waiting_since=9.9, audio_end=NEVER)
    assert held_for([ample], now, 0.05) == 0.05
    assert abs(held_for([ample, soon], now, 0.05) - 0.01) < 1e-9
    assert held_for([ample, due], now, 0.05) == 0.0  # a due window goes now, with its bucket
    assert held_for([ample], now, 0.0) == 0.0  # nothing announced
    assert held_for([], now, 0.05) == 0.0  # nothing pending


def test_first_window_hints_expire_end_on_arrival_and_stay_bounded() -> None:
    hints = FirstWindowHints(hold_s=0.05)
    hints.announce("a", 1.0)
    hints.announce("b", 1.02)
    assert abs(hints.remaining(1.03) - 0.04) < 1e-9  # until b's hold ends
    hints.arrived("b")
    assert abs(hints.remaining(1.03) - 0.02) < 1e-9
    assert hints.remaining(1.05) == 0.0 and len(hints) == 0  # a expired
    for i in range(MAX_HINTS + 5):
        hints.announce(f"r{i}", 2.0)
    assert len(hints) == MAX_HINTS  # the rest are ignored
    assert hints.remaining(2.1) == 0.0 and len(hints) == 0


def test_a_zero_hold_ignores_announcements() -> None:
    hints = FirstWindowHints(hold_s=0.0)
    hints.announce("a", 1.0)
    assert hints.remaining(1.0) == 0.0 and len(hints) == 0
