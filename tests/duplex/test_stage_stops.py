"""StageStops: every stage is stopped, a failing stage does not block the others, and after
`disable()` (server shutdown) nothing is called at all."""
from __future__ import annotations

from backends.contracts.stage_clients import STAGES
from backends.duplex.stage_stops import StageStops


class _Stages:
    def __init__(self, failing: str = "") -> None:
        self.stopped: list[tuple[str, str]] = []
        self._failing = failing

    def stop(self, stage: str, request_id: str) -> None:
        if stage == self._failing:
            raise RuntimeError(f"{stage} is down")
        self.stopped.append((stage, request_id))


def test_stops_every_stage_even_when_one_fails():
    stages = _Stages(failing="talker")
    StageStops(stages).stop("s.e0")
    assert stages.stopped == [(s, "s.e0") for s in STAGES if s != "talker"]


def test_a_subset_of_stages():
    stages = _Stages()
    StageStops(stages).stop("s.e1", ("talker", "code2wav"))
    assert stages.stopped == [("talker", "s.e1"), ("code2wav", "s.e1")]


def test_disabled_stops_call_nothing():
    stages = _Stages()
    stops = StageStops(stages)
    stops.disable()
    stops.stop("s.e0")
    assert stages.stopped == []
