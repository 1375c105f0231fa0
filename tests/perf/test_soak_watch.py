"""The soak's server watch: restarts read from the launcher's output, stub restarts from stub
pid sets, the kernel's segfault lines, and the neighbour's running flag per window."""
from __future__ import annotations

from perf.soak_launcher import parse_launcher_output
from perf.soak_neighbour import NeighbourTally
from perf.soak_processes import StubSnapshot, segfaults, stub_restarts

CLEAN = """tritonserver ready: grpc 127.0.0.1:8001, http http://127.0.0.1:8000, log var/logs/t.log, stage secret file s
tritonserver stopped (exit 0)
"""
RESTARTED = CLEAN.replace("tritonserver stopped", """tritonserver was killed by SIGSEGV: restarting (previous log kept as t.log.previous)
tritonserver ready again after 17.3 s
tritonserver failed 5 readiness probes in a row: restarting (previous log kept as t.log.previous)
tritonserver restart failed: tritonserver exited with 1; log: t.log
tritonserver is not running: restarting (previous log kept as t.log.previous)
tritonserver ready again after 21.0 s
tritonserver stopped""")


def test_a_clean_launcher_output_has_no_restart():
    events = parse_launcher_output(CLEAN)
    assert (events.deaths, events.ready_again_s, events.failed_restarts, events.given_up) == (0, (), 0, False)


def test_restarts_their_reasons_and_failures_are_read_from_the_output():
    events = parse_launcher_output(RESTARTED)
    assert events.restarts == ("was killed by SIGSEGV", "failed 5 readiness probes in a row", "is not running")
    assert events.deaths == 3
    assert events.ready_again_s == (17.3, 21.0)
    assert events.failed_restarts == 1
    assert not events.given_up


def test_giving_up_is_seen():
    text = CLEAN + "tritonserver exited with code 1; 5 restarts in the last 600 s: giving up\n"
    assert parse_launcher_output(text).given_up


def test_the_ready_line_of_the_first_start_is_not_a_restart():
    assert parse_launcher_output("tritonserver ready: grpc 127.0.0.1:1\n").ready_again_s == ()


def test_a_stub_gone_or_new_under_the_same_server_is_a_stub_restart():
    before = StubSnapshot(100, frozenset({101, 102, 103, 104}))
    assert stub_restarts(before, before) == 0
    assert stub_restarts(before, StubSnapshot(100, frozenset({101, 102, 103}))) == 1  # one died
    assert stub_restarts(before, StubSnapshot(100, frozenset({101, 102, 103, 105}))) == 1  # and came back
    assert stub_restarts(before, StubSnapshot(100, frozenset({101, 105, 106, 107}))) == 3


def test_a_new_server_pid_is_a_server_restart_not_a_stub_restart():
    before = StubSnapshot(100, frozenset({101, 102}))
    assert stub_restarts(before, StubSnapshot(200, frozenset({201, 202}))) == 0
    assert stub_restarts(before, StubSnapshot(None, frozenset())) == 0
    assert stub_restarts(StubSnapshot(None, frozenset()), before) == 0


def test_segfault_lines_of_the_watched_pids_only():
    log = ("[ 10.1] triton_python_b[4242]: segfault at 0 ip 00007f sp 00007f error 4 in libc.so\n"
           "[ 11.2] other[4243]: segfault at 0 ip 0 sp 0 error 4\n"
           "[ 12.3] triton_python_b[42]: general protection fault\n")
    assert segfaults(log, {4242, 42}) == [log.splitlines()[0]]
    assert segfaults(log, set()) == []


def test_segfault_lines_from_before_the_watch_are_left_out():
    """A pid the kernel gives out again: an earlier process's line is not this one's."""
    log = ("[ 9.5] triton_python_b[4242]: segfault at 60 ip 0 sp 0 error 4\n"
           "[  10.5] triton_python_b[4242]: segfault at 60 ip 0 sp 0 error 4\n")
    assert segfaults(log, {4242}, since_s=10.0) == [log.splitlines()[1]]


def test_the_neighbour_counts_as_running_in_every_window_it_touched():
    tally = NeighbourTally()
    assert not tally.ran_since_last_look()
    tally.set_running(True)
    tally.set_running(False)  # a short start and stop inside one window
    assert tally.ran_since_last_look()
    assert not tally.ran_since_last_look()
    tally.set_running(True)
    assert tally.ran_since_last_look() and tally.ran_since_last_look()  # still running
