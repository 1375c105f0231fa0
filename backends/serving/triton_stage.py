"""The body of a stage model (thinker, talker, code2wav) behind its thin `model.py`.

`execute` decodes each request into the stage contract and posts it to the engine thread;
a `stop` action is answered at once. Bad input is answered with INVALID_ARG + FINAL and
never reaches the engine.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Callable

from backends.serving.engine_thread import EngineThread, SteppedEngine
from backends.serving.triton_responses import ResponseThread, TritonSink, triton_error
from backends.serving.triton_tensors import ContractError, decode_request, encode_response
from backends.stages.contracts import ACTION_RUN, ACTION_STOP
from backends.stages.sink import StageError


def model_parameters(args: dict[str, Any]) -> dict[str, str]:
    """The `parameters { key value { string_value } }` map of a model config."""
    config = json.loads(args["model_config"])
    return {key: value["string_value"] for key, value in config.get("parameters", {}).items()}


class StageAdapter:
    def __init__(self, pb_utils: Any, name: str, request_cls: type, engine: SteppedEngine) -> None:
        self._pb = pb_utils
        self._name = name
        self._request_cls = request_cls
        self._responses = ResponseThread(pb_utils, f"{name}-responses")
        self.engine_thread = EngineThread(engine, f"{name}-engine", on_error=pb_utils.Logger.log_error)

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
        try:
            parsed = decode_request(self._pb, request, self._request_cls)
            if parsed.action not in (ACTION_RUN, ACTION_STOP):
                raise ContractError(f"ACTION must be {ACTION_RUN!r} or {ACTION_STOP!r}, got {parsed.action!r}")
        except ContractError as exc:
            self._fail(sender, StageError("invalid_argument", f"[{self._name}] {exc}"))
            return
        if parsed.action == ACTION_STOP:
            self.engine_thread.stop_request(parsed.request_id)
            self._responses.put(sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sink = TritonSink(self._pb, sender, self._responses, lambda result: encode_response(self._pb, result))
        self.engine_thread.submit(parsed, sink)

    def _fail(self, sender: Any, error: StageError) -> None:
        response = self._pb.InferenceResponse(error=triton_error(self._pb, error))
        self._responses.put(sender, response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.engine_thread.shutdown()
        self._responses.shutdown()


EngineFactory = Callable[[dict[str, str]], SteppedEngine]
__all__ = ["StageAdapter", "model_parameters", "EngineFactory", "logging"]
