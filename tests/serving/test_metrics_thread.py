"""MetricsThread against a fake metric API that records the calling thread of every call.

Strategy: hammer one MetricsThread from several threads and check that the metric API saw exactly
one thread (the metrics thread, not a caller: docs/triton_behaviours.md#custom-metrics), with
exact totals; check labels, buckets, kind checks, the disabled mode (`--allow-metrics=false`), and
that shutdown deletes every metric before its family.
"""
from __future__ import annotations

import threading

import pytest

from backends.serving.metrics_catalog import (
    ACTIVE_SESSIONS, ALL_METRICS, ERRORS, INSTANCE_LABELS, KV_BLOCKS_IN_USE, SESSIONS_OPENED, TTFP, MetricSpec,
    parse_samples, sample_sum,
)
from backends.serving.metrics_thread import MetricsThread

NUM_WRITERS = 8
UPDATES_PER_WRITER = 250


def test_updates_from_many_threads_reach_the_api_from_one_thread(pb):
    metrics = MetricsThread(pb, "duplex", "duplex_0_0")

    def writer(i: int) -> None:
        for _ in range(UPDATES_PER_WRITER):
            metrics.increment(SESSIONS_OPENED)
            metrics.increment(ACTIVE_SESSIONS, 1.0 if i % 2 else -1.0)
            metrics.observe(TTFP, float(i))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(NUM_WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    metrics.shutdown()
    callers = {t.ident for t in threads} | {threading.get_ident()}
    api_threads = {tid for _, _, tid in pb.metric_calls}
    assert len(api_threads) == 1 and not api_threads & callers
    assert pb.value(SESSIONS_OPENED.name) == NUM_WRITERS * UPDATES_PER_WRITER
    assert pb.value(ACTIVE_SESSIONS.name) == 0.0
    assert sorted(pb.observed(TTFP.name)) == sorted(float(i) for i in range(NUM_WRITERS)
                                                    for _ in range(UPDATES_PER_WRITER))
    # One family and one metric per label set, created once.
    assert [op for op, name, _ in pb.metric_calls if op == "family" and name == TTFP.name] == ["family"]


def test_labels_buckets_and_kinds(pb):
    metrics = MetricsThread(pb, "thinker", "thinker_0_0")
    metrics.increment(ERRORS, code="internal", channel="response")
    metrics.increment(ERRORS, 2.0, code="cancelled", channel="response")
    metrics.set(KV_BLOCKS_IN_USE, 12.0)
    metrics.set(KV_BLOCKS_IN_USE, 7.0)
    metrics.observe(TTFP, 180.0)
    metrics.shutdown()
    assert pb.value(ERRORS.name, code="cancelled") == 2.0 and pb.value(ERRORS.name) == 3.0
    assert pb.value(KV_BLOCKS_IN_USE.name, model="thinker", model_instance="thinker_0_0") == 7.0
    key = (TTFP.name, frozenset({"model": "thinker", "model_instance": "thinker_0_0"}.items()))
    assert pb.buckets[key] == list(TTFP.buckets)
    assert pb.family_kinds == {ERRORS.name: "COUNTER", KV_BLOCKS_IN_USE.name: "GAUGE", TTFP.name: "HISTOGRAM"}


def test_misuse_is_refused_in_the_caller(pb):
    metrics = MetricsThread(pb, "duplex", "")
    with pytest.raises(ValueError, match="labels"):
        metrics.increment(ERRORS, code="x")
    with pytest.raises(ValueError, match="cannot decrease"):
        metrics.increment(SESSIONS_OPENED, -1.0)
    with pytest.raises(ValueError, match="only gauges"):
        metrics.set(SESSIONS_OPENED, 3.0)
    with pytest.raises(ValueError, match="only histograms"):
        metrics.observe(ACTIVE_SESSIONS, 3.0)
    with pytest.raises(ValueError, match="observe"):
        metrics.increment(TTFP)
    metrics.shutdown()


def test_metrics_off_drops_updates_and_keeps_running(pb):
    pb.fail_families.set()
    metrics = MetricsThread(pb, "duplex", "duplex_0_0")
    for _ in range(5):
        metrics.increment(SESSIONS_OPENED)
    ran = []
    metrics.call(ran.append, "still running")
    metrics.shutdown()
    assert not metrics.enabled and ran == ["still running"]
    assert [op for op, _, _ in pb.metric_calls] == ["family"], "one failed attempt, then nothing"


def test_shutdown_deletes_metrics_before_their_families(pb):
    metrics = MetricsThread(pb, "talker", "talker_0_0")
    metrics.increment(ERRORS, code="a", channel="response")
    metrics.increment(ERRORS, code="b", channel="response")
    metrics.observe(TTFP, 1.0)
    metrics.shutdown()
    kinds = [entry.split(":")[0] for entry in pb.deletions]
    assert kinds == ["metric"] * 3 + ["family"] * 2


def test_call_runs_on_the_metrics_thread_in_order(pb):
    metrics = MetricsThread(pb, "duplex", "duplex_0_0")
    seen: list[tuple[int, int]] = []
    for i in range(5):
        metrics.call(lambda i=i: seen.append((i, threading.get_ident())))
    metrics.shutdown()
    assert [i for i, _ in seen] == list(range(5))
    assert len({tid for _, tid in seen}) == 1 and seen[0][1] != threading.get_ident()


def test_catalog_is_consistent():
    names = [spec.name for spec in ALL_METRICS]
    assert len(set(names)) == len(names) and all(n.startswith("minicpmo_") for n in names)
    with pytest.raises(ValueError, match="buckets"):
        MetricSpec("minicpmo_x", "histogram", "x")
    with pytest.raises(ValueError, match="increase"):
        MetricSpec("minicpmo_x", "histogram", "x", buckets=(2.0, 1.0))
    with pytest.raises(ValueError, match="added for every metric"):
        MetricSpec("minicpmo_x", "counter", "x", labels=INSTANCE_LABELS[:1])


def test_parse_samples_reads_a_metrics_page():
    page = "\n".join([
        "# HELP minicpmo_ttfp_ms x", "# TYPE minicpmo_ttfp_ms histogram",
        'minicpmo_ttfp_ms_count{model="duplex",model_instance="duplex_0_0"} 2',
        'minicpmo_ttfp_ms_bucket{model="duplex",model_instance="duplex_0_0",le="100"} 1',
        'minicpmo_errors_total{channel="uplink",code="invalid_argument",model="duplex"} 3',
        'minicpmo_errors_total{channel="downlink",code="invalid_argument",model="duplex"} 1',
        "nv_cpu_utilization 0.5",
    ])
    samples = parse_samples(page)
    assert sample_sum(samples, "minicpmo_ttfp_ms_count", model="duplex") == 2.0
    assert sample_sum(samples, "minicpmo_ttfp_ms_bucket", le="100") == 1.0
    assert sample_sum(samples, "minicpmo_errors_total", code="invalid_argument") == 4.0
    assert sample_sum(samples, "minicpmo_errors_total", channel="uplink") == 3.0
    assert sample_sum(samples, "nv_cpu_utilization") == 0.5
    assert sample_sum(samples, "minicpmo_missing") == 0.0
