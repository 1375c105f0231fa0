"""ResourceGauges and parse_gauges: counts become `minicpmo_<name>` gauges, set only on change,
switched off cleanly when metrics are off, and read back from a /metrics page.

Strategy: the fake stub of tests/serving/fake_pb_utils.py records every metric call with its
thread and keeps values, so the tests check exact values and exact call counts.
"""
from __future__ import annotations

import os

from backends.serving.resource_gauges import ResourceGauges, parse_gauges


def _value(pb, name: str, model: str) -> float:
    return pb.totals[(f"minicpmo_{name}", frozenset({("model", model), ("pid", str(os.getpid()))}))]


def test_counts_become_gauges_set_only_when_they_change(pb):
    gauges = ResourceGauges(pb, "talker")
    gauges.publish({"requests": 2, "kv_free_blocks": 10})
    gauges.publish({"requests": 2, "kv_free_blocks": 10})
    gauges.publish({"requests": 1, "kv_free_blocks": 10})
    assert _value(pb, "requests", "talker") == 1.0 and _value(pb, "kv_free_blocks", "talker") == 10.0
    sets = [name for op, name, _ in pb.metric_calls if op == "set"]
    assert sets == ["minicpmo_requests", "minicpmo_kv_free_blocks", "minicpmo_requests"]
    assert pb.family_kinds["minicpmo_requests"] == pb.MetricFamily.GAUGE


def test_metrics_off_disables_the_gauges_without_raising(pb):
    pb.fail_families.set()
    gauges = ResourceGauges(pb, "thinker")
    gauges.publish({"requests": 1})
    gauges.publish({"requests": 2})
    assert [op for op, _, _ in pb.metric_calls] == ["family"]  # tried once, then quiet


def test_parse_gauges_sums_instances_and_skips_other_lines():
    page = "\n".join([
        "# HELP minicpmo_requests live requests",
        "# TYPE minicpmo_requests gauge",
        'minicpmo_requests{model="thinker",pid="11"} 2',
        'minicpmo_requests{model="thinker",pid="12"} 1',
        'minicpmo_kv_free_blocks{pid="13",model="talker"} 768',
        'nv_inference_count{model="duplex",version="1"} 5',
    ])
    assert parse_gauges(page) == {("requests", "thinker"): 3.0, ("kv_free_blocks", "talker"): 768.0}


def test_cuda_memory_counts_only_where_the_process_uses_cuda(monkeypatch) -> None:
    """CPU stages and processes without torch publish no CUDA gauges; a stage on a GPU publishes
    its allocator's peak and reservation in MiB."""
    import sys
    import types

    from backends.serving.resource_gauges import DESCRIPTIONS, cuda_memory_counts

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert cuda_memory_counts() == {}
    cuda = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert cuda_memory_counts() == {}
    cuda.is_initialized = lambda: True
    cuda.memory_stats = lambda: {"allocated_bytes.all.peak": 5 * (1 << 30) + 1,
                                 "reserved_bytes.all.current": 6 * (1 << 30), "num_ooms": 0}
    counts = cuda_memory_counts()
    assert counts == {"cuda_peak_allocated_mib": 5120, "cuda_reserved_mib": 6144}
    assert set(counts) <= set(DESCRIPTIONS)


def test_the_cuda_memory_reader_reads_at_most_once_a_period(monkeypatch) -> None:
    """The stage publishes after every engine step; the allocator's statistics are read at most
    once per period and the last reading stands in between."""
    import sys
    import types

    from backends.serving.resource_gauges import CudaMemoryReader

    reads = []

    def memory_stats() -> dict[str, int]:
        reads.append(1)
        return {"allocated_bytes.all.peak": len(reads) << 20, "reserved_bytes.all.current": 8 << 20}

    cuda = types.SimpleNamespace(is_initialized=lambda: True, memory_stats=memory_stats)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    now = [100.0]
    reader = CudaMemoryReader(every_s=1.0, clock=lambda: now[0])
    assert reader.counts() == {"cuda_peak_allocated_mib": 1, "cuda_reserved_mib": 8}
    now[0] += 0.5
    assert reader.counts()["cuda_peak_allocated_mib"] == 1 and len(reads) == 1
    now[0] += 0.5
    assert reader.counts()["cuda_peak_allocated_mib"] == 2 and len(reads) == 2
