"""The server's resource gauges that are zero when no session is open (as tests/server reads
them): sessions, their threads, the stages' requests and codec state."""
from __future__ import annotations

import time
import urllib.request

from backends.serving.resource_gauges import parse_gauges

ZERO_WHEN_IDLE = (
    ("sessions", "duplex"), ("session_threads", "duplex"), ("uplink_audio_ms", "duplex"),
    ("requests", "thinker"), ("runner_requests", "thinker"), ("requests", "talker"), ("runner_requests", "talker"),
    ("requests", "code2wav"), ("codec_states", "code2wav"), ("codec_sequences", "code2wav"),
    ("codec_pending", "code2wav"),
)


def held(server) -> dict[tuple[str, str], float]:
    """The zero-when-idle gauges that are not zero (a gauge not published yet counts as zero)."""
    url = f"http://{server.options.address}:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        gauges = parse_gauges(response.read().decode())
    return {key: gauges[key] for key in ZERO_WHEN_IDLE if gauges.get(key, 0.0) != 0.0}


def settle(read, timeout_s: float = 60.0):
    """Poll `read` until it returns something empty; the last value either way."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return value
