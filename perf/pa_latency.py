"""First-response and inter-response latencies from a perf_analyzer `--profile-export-file`.

perf_analyzer's own latency for decoupled models runs to the last response
(docs/triton_behaviours.md#perf_analyzer-and-decoupled-models), so the streaming
numbers come from the export: per request, `timestamp` (sent, ns), `response_timestamps` (ns)
and `response_outputs`. A stage puts its last result on the FINAL
response, and a request without data (a stage `stop`, a duplex uplink ack) is answered by an
empty FINAL alone and counts in `acks`, not in the latencies. perf_analyzer 2.51 exports an
entry under every output name for an empty response too, filled with whatever its buffers held,
so outputs alone cannot tell data from an empty FINAL: a stage response is data when its
REQUEST_ID output is the request's own id (every stage result names its request), and a `stop`
request is an ack whatever its outputs say. An export read by scanning its text has no outputs:
there a `stop` (its ACTION input is still read) is an ack and every other response is data.

For `duplex`, the START request carries the whole downlink: its `EVENT` outputs say which
response is the first audio (TTFP from START), and the audio deltas give the inter-chunk gaps;
the server's own `ttfp_ms` is read from the first audio event.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perf.bench_stats import Distribution
from perf.pa_inputs import STOP_BYTES

NS_PER_MS = 1e6


@dataclass(frozen=True, slots=True)
class StreamLatency:
    requests: int  # requests with data responses
    acks: int  # requests answered by FINAL alone
    first_response_ms: Distribution
    inter_response_ms: Distribution
    last_response_ms: Distribution


@dataclass(frozen=True, slots=True)
class DuplexLatency:
    sessions: int
    session_created_ms: Distribution  # START -> session.created
    ttft_ms: Distribution  # START -> first text delta
    ttfp_ms: Distribution  # START -> first audio delta
    server_ttfp_ms: Distribution  # the server's ttfp_ms on that delta
    audio_gap_ms: Distribution  # between consecutive audio deltas
    uplink_ack_ms: Distribution  # uplink request -> its FINAL


def load_requests(path: Path) -> list[dict[str, Any]]:
    """Every request of every experiment in the export. An export that is not valid JSON
    (perf_analyzer 2.51 wrote one for Code2Wav's float32 audio outputs on an H200) still gives
    its timestamps; its requests then have no `response_outputs`."""
    text = Path(path).read_text(errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return timestamps_only(text)
    return [request for experiment in data.get("experiments", []) for request in experiment.get("requests", [])]


_TIMESTAMP = re.compile(r'"timestamp"\s*:\s*(\d+)')
_RESPONSE_TIMESTAMPS = re.compile(r'"response_timestamps"\s*:\s*\[([\d,\s]*)\]')
_ACTION = re.compile(r'"ACTION"\s*:\s*\[([\d,\s]*)\]')


def timestamps_only(text: str) -> list[dict[str, Any]]:
    """Requests read by scanning the export's text: each `response_timestamps` list with the
    `timestamp` that precedes it most closely (a request's own, as perf_analyzer writes them),
    and the ACTION input written between the two, if any."""
    sent = [(m.start(), int(m.group(1))) for m in _TIMESTAMP.finditer(text)]
    requests, i = [], -1
    for match in _RESPONSE_TIMESTAMPS.finditer(text):
        while i + 1 < len(sent) and sent[i + 1][0] < match.start():
            i += 1
        if i >= 0:
            request: dict[str, Any] = {"timestamp": sent[i][1], "response_timestamps": _ints(match.group(1))}
            action = _ACTION.search(text, sent[i][0], match.start())
            if action is not None:
                request["request_inputs"] = {"ACTION": _ints(action.group(1))}
            requests.append(request)
    return requests


def _ints(listed: str) -> list[int]:
    return [int(t) for t in listed.replace(" ", "").split(",") if t.strip()]


def stream_latency(requests: Iterable[dict[str, Any]]) -> StreamLatency:
    first, inter, last, acks, count = [], [], [], 0, 0
    for request in requests:
        data = _data_offsets_ms(request)
        if not data:
            acks += 1
            continue
        count += 1
        first.append(data[0])
        last.append(data[-1])
        inter.extend(b - a for a, b in zip(data, data[1:]))
    return StreamLatency(count, acks, Distribution.of(first), Distribution.of(inter), Distribution.of(last))


def duplex_latency(requests: Iterable[dict[str, Any]]) -> DuplexLatency:
    created, ttft, ttfp, server, gaps, acks, sessions = [], [], [], [], [], [], 0
    for request in requests:
        events = _events(request)
        if not events:
            acks.extend(_offsets_ms(request)[-1:])
            continue
        sessions += 1
        created.extend(t for t, e in events[:1] if e.get("type") == "session.created")
        ttft.extend(_first_time(events, "response.text.delta"))
        audio = [(t, e) for t, e in events if e.get("type") == "response.audio.delta"]
        ttfp.extend(t for t, _ in audio[:1])
        server.extend(e["ttfp_ms"] for _, e in audio[:1] if isinstance(e.get("ttfp_ms"), (int, float)))
        gaps.extend(b - a for (a, _), (b, _) in zip(audio, audio[1:]))
    dist = Distribution.of
    return DuplexLatency(sessions, dist(created), dist(ttft), dist(ttfp), dist(server), dist(gaps), dist(acks))


def to_json(result: StreamLatency | DuplexLatency) -> dict[str, Any]:
    return asdict(result)


def _offsets_ms(request: dict[str, Any]) -> list[float]:
    sent = request["timestamp"]
    return [(t - sent) / NS_PER_MS for t in request.get("response_timestamps", [])]


def _data_offsets_ms(request: dict[str, Any]) -> list[float]:
    """The offsets of the responses that carried data: none for a `stop`; else those whose
    outputs name the request (all of them when the export gave no outputs: a text-scanned one)."""
    inputs = request.get("request_inputs", {})
    if inputs.get("ACTION") == STOP_BYTES:
        return []
    outputs = request.get("response_outputs")
    offsets = _offsets_ms(request)
    if outputs is None:
        return offsets
    return [t for t, out in zip(offsets, outputs) if _carries_data(out, inputs.get("REQUEST_ID"))]


def _carries_data(output: Any, request_id: Any) -> bool:
    """A response with outputs, and with the request's own REQUEST_ID when the request sent one
    (an empty FINAL's exported outputs are leftover bytes, never the request's id)."""
    if not output:
        return False
    return request_id is None or (isinstance(output, dict) and output.get("REQUEST_ID") == request_id)


def _events(request: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    """(ms after the request, parsed EVENT) of each response that carried an event."""
    events = []
    for offset, output in zip(_offsets_ms(request), request.get("response_outputs", [])):
        raw = output.get("EVENT") if isinstance(output, dict) else None
        if isinstance(raw, str) and raw.startswith("{"):
            try:
                events.append((offset, json.loads(raw)))
            except json.JSONDecodeError:
                continue
    return events


def _first_time(events: list[tuple[float, dict[str, Any]]], kind: str) -> list[float]:
    """[ms of the first event of `kind`], or [] when there is none."""
    return [t for t, e in events if e.get("type") == kind][:1]
