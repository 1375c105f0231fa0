"""Benchmarks: the duplex realtime benchmark, perf_analyzer inputs and scripts, a locustfile."""
