"""perf/bench_stage_calls.py: both modes run every stage's calls, and only `fresh` reopens streams."""
from __future__ import annotations

from perf.bench_stage_calls import MODES, bench


class CountingChannel:
    made: list["CountingChannel"] = []

    def __init__(self, url: str, timeout_s: float) -> None:
        self.calls, self.streams, self.open, self.closed = [], 0, False, False
        CountingChannel.made.append(self)

    def call(self, model, arrays):
        self.calls.append(model)
        if not self.open:
            self.streams, self.open = self.streams + 1, True
        yield from ()

    def end_stream(self) -> None:
        self.open = False

    def close(self) -> None:
        self.closed = True


def test_each_stage_is_timed_in_both_modes_and_only_fresh_reopens_its_stream():
    CountingChannel.made = []
    results = bench("host:1", calls=5, rounds=2, channel_factory=CountingChannel)
    assert list(results) == ["thinker", "talker", "code2wav"]
    assert all(len(per_mode[mode]) == 2 and min(per_mode[mode]) > 0 for per_mode in results.values() for mode in MODES)
    for channel, stage in zip(CountingChannel.made, results):
        assert set(channel.calls) == {stage} and len(channel.calls) == 2 * 2 * (20 + 5) and channel.closed
        # fresh: a stream per call (2 rounds x 25), but its first call of round 2 uses the one
        # `kept` left open; kept: one stream per round
        assert channel.streams == (25 + 24) + 2
