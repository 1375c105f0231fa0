"""The test-only fault hook: off by default, fires only for marked request ids, and the
Code2Wav engine contains a fault in one request's window to that request.

Strategy: FaultHook and install_fault_hook on small engine stand-ins; the Code2Wav engine over a
duck-typed vocoder (fixed-length audio per window), so the test needs no model weights. The
Thinker and Talker call the hook inside their existing per-request guards (their containment
is tested in tests/stages); the end-to-end containment runs on the real server in
tests/server/test_reliability_faults.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from backends.contracts.messages import Code2WavRequest
from backends.contracts.sink import ListSink
from backends.serving.fault_injection import FaultHook, InjectedFault, fault_marker, install_fault_hook
from backends.stages.code2wav_engine import ERROR_INTERNAL, Code2WavEngine
from backends.stages.code2wav_service import Code2WavService

SAMPLES_PER_WINDOW = 480


class _Vocoder:
    """Duck-typed Token2Wav: a stream per request, fixed audio per decoded window."""

    config = SimpleNamespace(flow=SimpleNamespace(encoder=SimpleNamespace(pre_lookahead_len=3), vocab_size=6561))
    sample_rate = 24000
    cache_pool = None  # dense caches: no slots to wait for

    def new_stream(self, *args: object, **kwargs: object) -> object:
        return object()

    def release_stream(self, stream: object) -> None:
        pass

    def decode(self, windows: list) -> list[np.ndarray]:
        return [np.ones(SAMPLES_PER_WINDOW, np.float32) for _ in windows]

    def graph_counts(self) -> dict[str, int]:
        return {"cuda_graphs": 0, "graph_eager_calls": 0}


def _window(request_id: str, chunk_seq: int = 0) -> Code2WavRequest:
    return Code2WavRequest(request_id, 0, chunk_seq, np.arange(28, dtype=np.int32), 3, False)


def test_hook_fires_only_for_its_stage_marker():
    hook = FaultHook("talker")
    hook("s-1.e0")
    hook(f"x-{fault_marker('thinker')}.e0")
    with pytest.raises(InjectedFault, match="talker"):
        hook(f"rel-{fault_marker('talker')}-1.e0")


def test_install_is_off_by_default_and_refuses_unknown_settings():
    engine = SimpleNamespace(fault_hook=None)
    assert not install_fault_hook(engine, "thinker", "off") and engine.fault_hook is None
    assert install_fault_hook(engine, "thinker", "on") and engine.fault_hook == FaultHook("thinker")
    with pytest.raises(ValueError, match="'yes'"):
        install_fault_hook(engine, "thinker", "yes")
    with pytest.raises(ValueError, match="no fault_hook"):
        install_fault_hook(SimpleNamespace(), "talker", "on")


def test_install_reaches_the_engine_inside_the_code2wav_service():
    service = Code2WavService(Code2WavEngine(_Vocoder(), object()))
    assert install_fault_hook(service, "code2wav", "on")
    assert service.engine.fault_hook == FaultHook("code2wav")


def test_a_faulty_window_fails_its_request_only_and_frees_its_state():
    engine = Code2WavEngine(_Vocoder(), object())
    engine.fault_hook = FaultHook("code2wav")
    bad = f"a-{fault_marker('code2wav')}.e0"
    for request_id in (bad, "good.e0"):
        engine.submit(_window(request_id))
    engine.submit(_window(bad, chunk_seq=1))  # queued behind the failing window
    results = {r.request_id: r for r in engine.step()}
    assert results[bad].error.startswith(f"{ERROR_INTERNAL}: InjectedFault")
    assert results["good.e0"].error is None and results["good.e0"].audio.size == SAMPLES_PER_WINDOW
    assert engine.resource_counts() == {"codec_states": 1, "codec_sequences": 1, "codec_pending": 0,
                                        "codec_slot_waits": 0, "voice_cache": 0, "voice_users": 0, "cuda_graphs": 0,
                                        "graph_eager_calls": 0}  # fmt: skip


def test_service_answers_an_internal_fault_as_internal_and_ends_the_other_windows():
    service = Code2WavService(Code2WavEngine(_Vocoder(), object()))
    install_fault_hook(service, "code2wav", "on")
    bad = f"a-{fault_marker('code2wav')}.e0"
    first, second, good = ListSink(), ListSink(), ListSink()
    service.submit(_window(bad), first)
    service.submit(_window(bad, chunk_seq=1), second)
    service.submit(_window("good.e0"), good)
    while service.has_work():
        service.step()
    assert first.error.code == "internal" and "InjectedFault" in first.error.message
    assert second.closed and second.error is not None  # never left without a FINAL
    assert good.error is None and len(good.results) == 1
    assert service.resource_counts()["requests"] == 0
