"""Where the time of one 1-second unit goes: Thinker, and the audio tail (Talker + Code2Wav).

Two sources, reported side by side:
- the server's own metrics: every `minicpmo_*` histogram or summary on the metrics port
  (families with `_sum` and `_count`, e.g. a per-stage step time labelled by `model`) is
  scraped before and after a level; the report gives the mean per observation over the level
  (delta sum / delta count) for each (family, model);
- an estimate from timestamps the server already emits, always available: a unit is complete
  when the client sends the append that fills it (16000 samples); the Thinker time of unit u
  is the arrival of its decision event (`response.listen` or `response.text.delta`, both
  carrying `unit_index`) minus that send time; the audio-tail time of the j-th speak unit is
  the arrival of the j-th audio delta carrying text minus the arrival of the j-th text delta.
  Both include orchestration, IPC and queueing, which is what a session feels.
"""
from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from perf.bench_stats import Distribution
from perf.turn import TurnRecord

UNIT_SAMPLES = 16000  # one unit = 1 s at 16 kHz
METRIC_PREFIX = "minicpmo_"

# (family without _sum/_count/_bucket, model label or "" with "/<stage>" or "/<kind>" when the series
# has such a label: the orchestrator's stage calls, Code2Wav's window waits)
SeriesKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class UnitEstimate:
    decided_units: int  # units the Thinker decided (listen or speak) over the level
    speak_units: int  # units voiced by the Talker and Code2Wav
    thinker_ms: Distribution  # unit complete -> its decision event, every unit
    first_thinker_ms: Distribution  # the same for unit 0 (prefills the text prompt)
    tail_ms: Distribution  # speak unit's text -> its first audio


@dataclass(frozen=True, slots=True)
class ServerSeries:
    family: str
    model: str
    observations: float
    total: float  # delta sum, in the family's own unit
    mean: float | None  # delta sum / delta count
    p99_bound: float | None = None  # histogram: the bucket bound under which 99% fell (inf: beyond the last)


def estimate_units(records: Sequence[TurnRecord], append_ms: int) -> UnitEstimate:
    thinker: list[float] = []
    first: list[float] = []
    tail: list[float] = []
    for record in records:
        for unit, delay_ms in _thinker_delays(record, append_ms):
            (first if unit == 0 else thinker).append(delay_ms)
        tail.extend(_tail_delays(record))
    decided = sum(e.kind in ("decision", "text") for r in records for e in r.unit_events)
    spoken = sum(e.kind == "text" for r in records for e in r.unit_events)
    return UnitEstimate(decided, spoken, Distribution.of(thinker), Distribution.of(first), Distribution.of(tail))


def step_time_per_unit(series: Sequence[ServerSeries], decided_units: int, speak_units: int) -> dict[str, float]:
    """{stage: engine step time summed over the level / the units it served}: the cost of one
    unit, from the server's per-stage step-time histograms (families named `*step*`)."""
    served = {"thinker": decided_units, "talker": speak_units, "code2wav": speak_units}
    costs = {}
    for s in series:
        if "step" in s.family and served.get(s.model):
            costs[s.model] = s.total / served[s.model]
    return costs


def _thinker_delays(record: TurnRecord, append_ms: int) -> list[tuple[int, float]]:
    samples_per_append = UNIT_SAMPLES * append_ms // 1000
    delays = []
    for event in record.unit_events:
        if event.kind not in ("decision", "text") or event.unit_index is None:
            continue
        last_append = -(-(event.unit_index + 1) * UNIT_SAMPLES // samples_per_append) - 1
        if last_append < len(record.append_times_s):
            delays.append((event.unit_index, 1000.0 * (event.received_s - record.append_times_s[last_append])))
    return delays


def _tail_delays(record: TurnRecord) -> list[float]:
    texts = [e for e in record.unit_events if e.kind == "text" and e.text]
    voiced = [e for e in record.unit_events if e.kind == "audio" and e.text]
    return [1000.0 * (audio.received_s - text.received_s) for text, audio in zip(texts, voiced)]


def scrape(metrics_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Every `minicpmo_*` sample of the Prometheus text pages in `metrics_url` (comma-separated:
    one per server replica, summed), keyed by its full series line head (name and labels); an
    unreachable endpoint contributes nothing."""
    total: dict[str, float] = {}
    for url in filter(None, (part.strip() for part in metrics_url.split(","))):
        for head, value in _scrape_one(url, timeout_s).items():
            total[head] = total.get(head, 0.0) + value
    return total


def _scrape_one(metrics_url: str, timeout_s: float) -> dict[str, float]:
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}
    return parse_samples(text)


def parse_samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith(METRIC_PREFIX):
            head, _, value = line.rpartition(" ")
            try:
                samples[head] = float(value)
            except ValueError:
                continue
    return samples


def server_series(before: dict[str, float], after: dict[str, float]) -> list[ServerSeries]:
    """Mean per observation of every histogram/summary that was observed during the level, and
    for histograms the bucket bound under which 99% of those observations fell."""
    sums, counts = _split(after, before, "_sum"), _split(after, before, "_count")
    buckets = _split(after, before, "_bucket", by_bound=True)
    series = []
    for key in sorted(sums.keys() & counts.keys()):
        count = counts[key]
        if count > 0:
            bound = _quantile_bound(buckets, key, 0.99 * count)
            series.append(ServerSeries(key[0], key[1], count, sums[key], sums[key] / count, bound))
    return series


def _quantile_bound(buckets: dict, key: SeriesKey, rank: float) -> float | None:
    """The smallest bucket bound whose cumulative count reaches `rank`; None without buckets."""
    bounds = sorted((bound, n) for (k, bound), n in buckets.items() if k == key)
    return next((bound for bound, n in bounds if n >= rank), None)


def _split(after: dict[str, float], before: dict[str, float], suffix: str,
           by_bound: bool = False) -> dict:  # fmt: skip
    """{(family, model[/stage or kind]): after - before} of the series named `<family><suffix>{...}`;
    with `by_bound`, keyed ((family, model[/...]), le) (Prometheus buckets are cumulative)."""
    deltas: dict = {}
    for head, value in after.items():
        name, _, labels = head.partition("{")
        if not name.endswith(suffix):
            continue
        part = _label(labels, "stage") or _label(labels, "kind")  # a split of the family
        key: object = (name[: -len(suffix)], _label(labels, "model") + (f"/{part}" if part else ""))
        if by_bound:
            key = (key, float(_label(labels, "le") or "inf"))
        deltas[key] = deltas.get(key, 0.0) + value - before.get(head, 0.0)
    return deltas


def _label(labels: str, key: str) -> str:
    for item in labels.rstrip("}").split(","):
        name, _, value = item.partition("=")
        if name.strip() == key:
            return value.strip().strip('"')
    return ""
