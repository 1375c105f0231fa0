"""The custom Prometheus metrics of the repository: names, kinds, labels, buckets.

Every metric carries the instance labels `model` (thinker | talker | code2wav | duplex) and
`model_instance` (Triton's instance name, e.g. `duplex_0_1`), so instances of one model never
share a series; aggregate with `sum by (model)`. Times are in milliseconds. The table in
docs/metrics.md ("Server metrics (Prometheus)") lists the same names in catalog order; a test
keeps the two in step.
`parse_samples` reads a `/metrics` page back (tests, benchmarks).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
INSTANCE_LABELS = ("model", "model_instance")

# TTFP of a voice reply: tens of ms on an idle GPU to seconds under load
# (docs/metrics.md#server-metrics-prometheus).
TTFP_BUCKETS_MS = (50.0, 100.0, 200.0, 300.0, 400.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0,
                   10000.0)
# Audio deltas of one response are ~1 s of speech apart when keeping up; > 100 ms beyond
# playback starts to underrun a 200 ms client buffer.
GAP_BUCKETS_MS = (10.0, 25.0, 50.0, 100.0, 200.0, 300.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 5000.0)
STEP_BUCKETS_MS = (1.0, 2.0, 5.0, 10.0, 20.0, 35.0, 50.0, 75.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
# A request's wait for its engine thread: ~0 when idle, up to a forward (5-50 ms) when busy.
INBOX_BUCKETS_MS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 35.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
# A stage call's first result: ~15-70 ms on an H200 when nothing queues, rare stalls of 250-600.
CALL_BUCKETS_MS = (5.0, 10.0, 20.0, 35.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0, 2000.0,
                   5000.0)
# One hop of a stage call (orchestrator -> stage, stage -> server): ~0.1-1 ms on an idle host.
HOP_BUCKETS_MS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: str  # counter | gauge | histogram
    description: str
    labels: tuple[str, ...] = ()  # label names beyond INSTANCE_LABELS
    buckets: tuple[float, ...] = ()  # histogram upper bounds, increasing

    def __post_init__(self) -> None:
        if self.kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise ValueError(f"metric {self.name}: kind must be counter, gauge or histogram, got {self.kind!r}")
        if (self.kind == HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"metric {self.name}: buckets are required for histograms and only for them")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"metric {self.name}: buckets must increase strictly, got {self.buckets}")
        if set(self.labels) & set(INSTANCE_LABELS):
            raise ValueError(f"metric {self.name}: labels {INSTANCE_LABELS} are added for every metric")


ACTIVE_SESSIONS = MetricSpec(
    "minicpmo_active_sessions", GAUGE, "Open duplex sessions (session.created not yet followed by session.closed)")
SESSIONS_OPENED = MetricSpec("minicpmo_sessions_opened_total", COUNTER, "Duplex sessions opened (session.created)")
RESPONSES = MetricSpec(
    "minicpmo_responses_total", COUNTER, "Model responses (turns) by final status", ("status",))
TTFP = MetricSpec(
    "minicpmo_ttfp_ms", HISTOGRAM,
    "Server time to first audio: accepted append that triggered the response to its first audio chunk, ms",
    buckets=TTFP_BUCKETS_MS)
CHUNK_GAP = MetricSpec(
    "minicpmo_inter_chunk_gap_ms", HISTOGRAM,
    "Time between consecutive audio chunks of one response as sent by the server, ms", buckets=GAP_BUCKETS_MS)
ERRORS = MetricSpec(
    "minicpmo_errors_total", COUNTER,
    "Errors by code; channel: downlink = error event of a session, uplink = failed duplex request, "
    "response = failed stage request", ("code", "channel"))
STEP_TIME = MetricSpec(
    "minicpmo_stage_step_ms", HISTOGRAM, "Wall time of one engine step of a stage (one batched forward), ms",
    buckets=STEP_BUCKETS_MS)
STAGE_CALL = MetricSpec(
    "minicpmo_stage_call_ms", HISTOGRAM,
    "Orchestrator: a stage call to its first result (a Thinker unit, a Talker request's first codes, "
    "a Code2Wav window's audio), ms; only with MINICPMO_STAGE_CALL_METRICS=1", ("stage",),
    buckets=CALL_BUCKETS_MS)
INBOX_WAIT = MetricSpec(
    "minicpmo_stage_inbox_wait_ms", HISTOGRAM,
    "A stage request's arrival at its engine thread (posted by execute) to the thread taking it "
    "in; Talker and Code2Wav threads do so only between steps (mostly the wait for a running "
    "forward), the Thinker's also while its step is on the GPU, ms",
    buckets=INBOX_BUCKETS_MS)
WINDOW_WAIT = MetricSpec(
    "minicpmo_code2wav_window_wait_ms", HISTOGRAM,
    "Code2Wav: a window's acceptance by the engine thread (between forwards; the wait before it is "
    "minicpmo_stage_inbox_wait_ms) to the start of the forward that decodes it, by kind (first: a "
    "reply's first window; later: every other), ms",
    ("kind",), buckets=CALL_BUCKETS_MS)
STAGE_ARRIVAL = MetricSpec(
    "minicpmo_stage_arrival_ms", HISTOGRAM,
    "A stage request's trip from the orchestrator's send (its sent_ns parameter: the host's monotonic "
    "clock) to the stage's execute: gRPC client, Triton's frontend and scheduler, the stub's IPC, ms; "
    "only with MINICPMO_STAGE_CALL_METRICS=1", buckets=HOP_BUCKETS_MS)
STAGE_SEND = MetricSpec(
    "minicpmo_stage_send_ms", HISTOGRAM,
    "A stage response from the engine handing it over (encoded) to the stub's send returning (the "
    "server holds it): the response thread's queue and the stub's IPC, ms; only with "
    "MINICPMO_STAGE_CALL_METRICS=1", buckets=HOP_BUCKETS_MS)
KV_BLOCKS_IN_USE = MetricSpec(
    "minicpmo_kv_blocks_in_use", GAUGE, "KV-cache blocks held by live requests of a stage runner")

ALL_METRICS = (ACTIVE_SESSIONS, SESSIONS_OPENED, RESPONSES, TTFP, CHUNK_GAP, ERRORS, STEP_TIME, STAGE_CALL,
               INBOX_WAIT, WINDOW_WAIT, STAGE_ARRIVAL, STAGE_SEND, KV_BLOCKS_IN_USE)

# Error channels (the `channel` label of ERRORS).
CHANNEL_DOWNLINK = "downlink"
CHANNEL_UPLINK = "uplink"
CHANNEL_RESPONSE = "response"

_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_samples(page: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, frozenset of (label, value)): value} for every sample line of a /metrics page."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in page.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        samples[(name, frozenset(_LABEL.findall(labels or "")))] = float(value)
    return samples


def sample_sum(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels` (0.0 when none)."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)
