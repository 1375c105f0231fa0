"""perf/bench_stats.py: per-group means then mean/median/P99 across groups, checked against
hand-computed values on synthetic turns; failures are counted, never dropped."""
from __future__ import annotations

import numpy as np
import pytest

from perf.bench_stats import Distribution, group_means, summarize, turn_values

EXACT = 1e-9  # pure arithmetic on a handful of floats


def test_distribution_matches_numpy_linear_percentiles():
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    dist = Distribution.of(values)
    assert dist.count == 6
    assert dist.mean == pytest.approx(np.mean(values), abs=EXACT)
    assert dist.median == pytest.approx(2.8, abs=EXACT)
    assert dist.p99 == pytest.approx(np.percentile(values, 99), abs=EXACT)
    assert dist.max == 9.0


def test_distribution_ignores_missing_values_and_reports_empty():
    assert Distribution.of([None, float("nan"), 2.0]).count == 1
    empty = Distribution.of([])
    assert (empty.count, empty.mean, empty.p99) == (0, None, None)


def test_turn_values_prefer_the_server_and_fall_back_to_the_client(record_factory):
    with_server = turn_values(record_factory(ttfp_s=1.2, server_ttfp_ms=200.0))
    assert with_server["ttfp_ms"] == 200.0
    assert with_server["client_ttfp_ms"] == pytest.approx(1200.0, abs=1e-6)
    without = turn_values(record_factory(ttfp_s=1.2, server_ttfp_ms=None))
    assert without["ttfp_ms"] == pytest.approx(1200.0, abs=1e-6)


def test_rtf_of_a_synthetic_turn(record_factory):
    # last chunk at 1.2 + 2 s after the turn start, 3 s of audio
    values = turn_values(record_factory(ttfp_s=1.2, chunks=3))
    assert values["rtf"] == pytest.approx(3.2 / 3.0, abs=1e-9)
    assert values["audio_ms"] == pytest.approx(3000.0, abs=1e-9)


def test_group_means_average_over_the_groups_turns(record_factory):
    group = [record_factory(0, 0, server_ttfp_ms=100.0), record_factory(0, 1, server_ttfp_ms=300.0)]
    assert group_means(group)["server_ttfp_ms"] == pytest.approx(200.0, abs=EXACT)


def test_summary_counts_failures_and_keeps_their_groups(record_factory):
    ok = [record_factory(0, t, server_ttfp_ms=100.0) for t in range(2)]
    failed = [record_factory(1, 0, chunks=0, errors=("error event internal: boom",)),
              record_factory(1, 1, server_ttfp_ms=500.0)]
    summary = summarize(2, [ok, failed], duration_s=10.0)
    assert (summary.num_groups, summary.failed_groups) == (2, 1)
    assert (summary.num_turns, summary.failed_turns, summary.num_errors) == (4, 1, 1)
    # group means 100 and 500: the failed group's surviving turn still counts
    assert summary.metrics["server_ttfp_ms"].mean == pytest.approx(300.0, abs=EXACT)
    assert summary.turns_per_s == pytest.approx(0.4, abs=EXACT)


def test_summary_pacing_lateness_reads_the_append_times(record_factory):
    record = record_factory(appends=5)  # appends exactly on their 200 ms deadlines
    assert record.pacing_lateness_ms(200) == pytest.approx(0.0, abs=1e-6)
    assert record.pacing_lateness_ms(100) == pytest.approx(400.0, abs=1e-6)
