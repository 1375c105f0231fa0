"""Locust load test of the `duplex` model: each user holds one real-time paced session at a time.

    .venv/bin/python -m locust -f perf/locustfile.py --headless -u 4 -r 1 -t 60s \
        --host 127.0.0.1:8001 --csv perf/out/locust/run --only-summary

(`python -m` puts the repository root on sys.path; `pip install -e .[load]` installs a Locust
that coexists with tritonclient[all]'s geventhttpclient pin, see perf/README.md.)

A user runs benchmark turns back to back (perf/turn.py: its own session opened with a bundled
sentence as `initial_user_text` and a bundled voice, 200 ms appends of silence on absolute
deadlines until `response.done`). Every turn fires Locust request events whose "response time"
is the metric in ms, so Locust's percentiles are audio metrics: `ttfp_server`, `ttfp_client`,
`ttft_server`, `rtf_x1000` (RTF times 1000), `max_chunk_gap`, `underrun` (one per stall over
100 ms), `append_lateness` (the worst lag of an append behind its deadline: gevent's pacing
precision), and `turn` (wall time; failed turns carry the error as the exception).
"""
from __future__ import annotations

import itertools
import os
import uuid

from grpc.experimental import gevent as grpc_gevent

# grpcio's C core is not monkey-patchable: cooperative mode must be on before any channel.
grpc_gevent.init_gevent()

from locust import User, constant, task  # noqa: E402 - after init_gevent on purpose

from perf.bench_stats import turn_values  # noqa: E402
from perf.turn import TurnOptions, TurnRecord, run_turn  # noqa: E402
from perf.workload import ReplyShape, Workload  # noqa: E402

REQUEST_TYPE = "duplex"
TURNS_PER_GROUP = 4
_USER_IDS = itertools.count()


class DuplexUser(User):
    """One simulated caller: a session per turn, turns back to back (no think time)."""

    wait_time = constant(0)
    host = "127.0.0.1:8001"

    def on_start(self) -> None:
        shape = ReplyShape(int(os.environ.get("BENCH_REPLY_UNITS_MIN", "4")),
                           int(os.environ.get("BENCH_REPLY_UNITS_MAX", "6")),
                           int(os.environ.get("BENCH_REPLY_TOKENS_PER_UNIT", "4")))
        self.workload = Workload.load(shape)
        self.index = next(_USER_IDS)
        self.turns = itertools.cycle(self.workload.groups(1, TURNS_PER_GROUP, seed=self.index)[0])
        self.options = TurnOptions(url=self.host)
        self.run_id = f"locust-{uuid.uuid4().hex[:6]}-u{self.index}"

    @task
    def turn(self) -> None:
        spec = next(self.turns)
        record = run_turn(spec, self.workload.voices[spec.voice], self.options, self.run_id)
        self._fire_metrics(record)

    def _fire_metrics(self, record: TurnRecord) -> None:
        values = turn_values(record)
        audio_bytes = int(record.report.reply_audio_ms * 48)  # 24 kHz PCM16: 48 bytes per ms
        for name, key, scale in (("ttfp_server", "server_ttfp_ms", 1.0), ("ttfp_client", "client_ttfp_ms", 1.0),
                                 ("ttft_server", "server_ttft_ms", 1.0), ("rtf_x1000", "rtf", 1000.0),
                                 ("max_chunk_gap", "max_gap_ms", 1.0)):
            if values[key] is not None:
                self._fire(name, values[key] * scale, audio_bytes)
        measured = record.measured
        for stall_ms in measured.playback_stalls_ms if measured is not None else ():
            if stall_ms > 100.0:
                self._fire("underrun", stall_ms, 0)
        self._fire("append_lateness", record.pacing_lateness_ms(self.options.append_ms), 0)
        error = None if record.ok else RuntimeError("; ".join(record.report.errors) or "no completed reply")
        self._fire("turn", record.report.wall_s * 1000.0, audio_bytes, error)

    def _fire(self, name: str, value_ms: float, length: int, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(request_type=REQUEST_TYPE, name=name, response_time=value_ms,
                                             response_length=length, exception=exception, context={})

