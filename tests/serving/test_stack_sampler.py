"""The serving-time stack sampler: off by default, and its samples name where a thread works."""
from __future__ import annotations

import threading

from backends.serving.stack_sampler import ENV_DIR, StackSampler, collapse, start_stack_sampler
from perf.stack_report import read_folded, report, shares


def _spin_in_named_function(started: threading.Event, stop: threading.Event) -> None:
    started.set()
    while not stop.is_set():
        sum(range(1000))


def test_off_unless_the_directory_is_set(tmp_path):
    assert start_stack_sampler("thinker", environ={}) is None
    sampler = start_stack_sampler("thinker", environ={ENV_DIR: str(tmp_path / "samples")})
    assert sampler is not None
    sampler.stop()
    assert sampler.path.parent == tmp_path / "samples" and sampler.path.name.startswith("thinker-")


def test_samples_show_the_busy_thread_and_its_function(tmp_path):
    started, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=_spin_in_named_function, args=(started, stop), name="thinker-engine")
    worker.start()
    # its own thread never fires here (an hour between samples): the samples are taken below,
    # so the count does not depend on how busy the machine is
    sampler = StackSampler(tmp_path / "thinker-1.folded", interval_s=3600.0)
    try:
        assert started.wait(10)
        for _ in range(10):
            sampler.sample_once()
    finally:
        stop.set()
        worker.join()
        sampler.stop()
    threads = read_folded(sampler.path)
    assert "stack-sampler" not in threads, "the sampler does not sample itself"
    total, inclusive, _ = shares(threads["thinker-engine"])
    assert total == 10
    assert inclusive["test_stack_sampler.py:_spin_in_named_function"] == total
    text = "\n".join(report(sampler.path, "engine", top=5))
    assert "thread thinker-engine" in text and "_spin_in_named_function" in text


def test_collapse_goes_outer_to_leaf():
    def leaf():
        import sys
        return collapse(sys._getframe(), "main")

    stack = leaf().split(";")
    assert stack[0] == "main" and stack[-1] == "test_stack_sampler.py:leaf"
    assert stack[-2] == "test_stack_sampler.py:test_collapse_goes_outer_to_leaf"
