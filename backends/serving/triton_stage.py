"""The body of a stage model (thinker, talker, code2wav) behind its thin `model.py`.

`execute` decodes each request into the stage contract and posts it to the engine thread;
a request without this server's stage secret is refused with `[forbidden]` before anything
else reads it, unless it is a `health` request (backends/serving/stage_secret.py);
a `stop` action is answered at once, and so are a `health` action (UNAVAILABLE once the
engine thread is gone: backends/serving/stage_health.py) and, for an engine that takes it (Code2Wav),
an `expect` action: the announcement goes to the engine thread, nobody waits for its effect.
Bad input is answered with INVALID_ARG + FINAL and never reaches the engine. Metrics go through the instance's one MetricsThread.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from backends.contracts.errors import StageError
from backends.contracts.messages import ACTION_EXPECT, ACTION_RUN, ACTION_STOP
from backends.serving.stack_dump import enable_stack_dump
from backends.serving.stack_sampler import start_stack_sampler
from backends.serving.engine_thread import EngineThread, SteppedEngine
from backends.serving.fault_injection import install_fault_hook
from backends.serving.metrics_stage import StageMetrics
from backends.serving.metrics_stage_calls import call_metrics_enabled, sent_ns_of
from backends.serving.metrics_thread import MetricsThread
from backends.serving.resource_gauges import CudaMemoryReader, ResourceGauges
from backends.serving.stage_health import ACTION_HEALTH
from backends.serving.stage_secret import StageGuard
from backends.serving.triton_responses import ResponseThread, TritonSink, triton_error
from backends.serving.triton_tensors import ContractError, decode_request, encode_response, tensor_to_numpy

FORBIDDEN = "forbidden"


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """The `parameters { key value { string_value } }` map of a model config."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


def apply_memory_fraction(params: dict[str, str], device_id: str) -> None:
    """Cap this stage process's torch allocator on its GPU (profile variable
    `<stage>_memory_fraction`), so stages sharing a GPU cannot starve each other."""
    fraction = float(params.get("gpu_memory_fraction", "0") or 0)
    if fraction <= 0 or params.get("device", "cpu") != "cuda":
        return
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction, torch.device(f"cuda:{device_id}"))


class StageAdapter:
    def __init__(self, pb_utils: Any, name: str, request_cls: type, engine: SteppedEngine,
                 params: dict[str, str] | None = None, instance: str = "", guard: StageGuard | None = None) -> None:
        enable_stack_dump()
        self._guard = guard if guard is not None else StageGuard.from_environment()  # refuses to load on a bad file
        self._sampler = start_stack_sampler(name)
        self._pb = pb_utils
        self._name = name
        self._request_cls = request_cls
        if install_fault_hook(engine, name, (params or {}).get("fault_injection", "off")):
            pb_utils.Logger.log_warn(f"[{name}] fault_injection=on: requests marked 'fault-{name}' will fail")
        if not self._guard.enabled:
            pb_utils.Logger.log_warn(f"[{name}] no stage secret configured: this stage serves any client of the "
                                     "server's ports; expose only the duplex model (deploy/README.md)")
        self._metrics = StageMetrics(MetricsThread(pb_utils, name, instance), ResourceGauges(pb_utils, name))
        self._time_hops = call_metrics_enabled()  # arrival and send of every request (diagnostics)
        self._responses = ResponseThread(pb_utils, f"{name}-responses",
                                         on_sent=self._metrics.on_send if self._time_hops else None)
        observe_waits = getattr(engine, "observe_window_waits", None)  # Code2Wav's queueing
        if observe_waits is not None:
            observe_waits(self._metrics.on_window_wait)
        counts = getattr(engine, "resource_counts", None)
        memory = CudaMemoryReader()  # the allocator's peak and reservation, on a GPU
        observer = None if counts is None else (lambda: self._metrics.publish({**counts(), **memory.counts()}))
        self._expect = getattr(engine, "expect_window", None)  # Code2Wav's first-window hint
        self._actions = (ACTION_RUN, ACTION_STOP, ACTION_HEALTH) + ((ACTION_EXPECT,) if self._expect else ())
        self.engine_thread = EngineThread(engine, f"{name}-engine", on_error=pb_utils.Logger.log_error,
                                          observer=observer, on_step=self._metrics.on_step,
                                          on_inbox_wait=self._metrics.on_inbox_wait)
        if observer is not None:  # publish the idle engine's counts now, not at the first request
            self.engine_thread.call(observer)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            try:
                self._accept(request)
            except Exception as exc:  # answer this request; the others and the stage go on
                self._pb.Logger.log_error(f"[{self._name}] request failed: {exc!r}")
                self._fail(request.get_response_sender(),
                           StageError("internal", f"[{self._name}] {type(exc).__name__}: {exc}"))
        return None

    def _accept(self, request: Any) -> None:
        sender = request.get_response_sender()
        parameters = request.parameters()
        if not self._guard.allows(parameters) and self._action_of(request) != ACTION_HEALTH:
            self._fail(sender, StageError(FORBIDDEN, f"[{self._name}] stage models serve this server's own "
                                                     "orchestrator only: send sessions to the duplex model"))
            return
        if self._time_hops and (sent_ns := sent_ns_of(parameters)) is not None:
            self._metrics.on_arrival(time.monotonic_ns() - sent_ns)
        try:
            parsed = decode_request(self._pb, request, self._request_cls)
            if parsed.action not in self._actions:
                raise ContractError(f"ACTION must be one of {list(self._actions)}, got {parsed.action!r}")
        except ContractError as exc:
            self._fail(sender, StageError("invalid_argument", f"[{self._name}] {exc}"))
            return
        if parsed.action == ACTION_STOP:
            self.engine_thread.stop_request(parsed.request_id)
            self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if parsed.action == ACTION_HEALTH:
            self._answer_health(sender)
            return
        if parsed.action == ACTION_EXPECT:
            self.engine_thread.call(self._expect, parsed.request_id)
            self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sink = self._metrics.sink(
            TritonSink(self._pb, sender, self._responses, lambda result: encode_response(self._pb, result)))
        self.engine_thread.submit(parsed, sink)

    def _action_of(self, request: Any) -> str | None:
        """The ACTION of a request that has not been decoded (None when absent or not text):
        only `health` is served without the secret."""
        tensor = self._pb.get_input_tensor_by_name(request, "ACTION")
        if tensor is None:
            return None
        array = tensor_to_numpy(tensor)
        if array.dtype != "uint8" or array.ndim != 1:
            return None
        return array.tobytes().decode("utf-8", "replace")

    def _answer_health(self, sender: Any) -> None:
        if self.engine_thread.is_alive():
            self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        self._fail(sender, StageError("unavailable", f"[{self._name}] the engine thread is not running"))

    def _fail(self, sender: Any, error: StageError) -> None:
        self._metrics.count_error(error.code)
        response = self._pb.InferenceResponse(error=triton_error(self._pb, error))
        self._responses.put(sender, response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.engine_thread.shutdown()
        self._responses.shutdown()
        self._metrics.shutdown()
        if self._sampler is not None:
            self._sampler.stop()


EngineFactory = Callable[[dict[str, str]], SteppedEngine]
__all__ = ["StageAdapter", "model_parameters", "apply_memory_fraction", "EngineFactory", "logging"]
