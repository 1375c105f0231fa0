"""Triton side of the `duplex` orchestrator: downlink, uplink replies, BLS stage clients."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from backends.duplex.errors import DuplexError
from backends.duplex.events import ServerEvent
from backends.duplex.session_manager import ManagerConfig
from backends.duplex.stage_clients import CODE2WAV, TALKER, THINKER, StageCallError
from backends.duplex.uplink import RawUplink
from backends.serving.triton_responses import ResponseThread, parse_error_message
from backends.serving.triton_tensors import tensor_to_numpy, output_tensors
from backends.stages.contracts import (
    Code2WavAudio, Code2WavRequest, TalkerCodes, TalkerRequest, ThinkerRequest, ThinkerUnitResult, stop_request,
)
from backends.stages.tensor_codec import from_arrays, tensor_specs, to_arrays

# DuplexError.code -> TritonError code attribute name
_UPLINK_ERROR_CODES = {"invalid_argument": "INVALID_ARG", "session_not_found": "NOT_FOUND",
                       "resource_exhausted": "UNAVAILABLE"}


def raw_uplink(pb_utils: Any, request: Any) -> RawUplink:
    flags = request.flags()
    return RawUplink(
        session_id=str(request.correlation_id()),
        is_start=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
        is_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
        audio=_optional_input(pb_utils, request, "AUDIO"),
        ref_audio=_optional_input(pb_utils, request, "REF_AUDIO"),
        parameters=request.parameters() or "{}",
    )


def _optional_input(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor_to_numpy(tensor)


class TritonDownlink:
    """The START request's response sender, kept open for the whole session."""

    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread) -> None:
        self._pb, self._sender, self._responses = pb_utils, sender, responses

    def send(self, event: ServerEvent) -> None:
        arrays = {"EVENT": np.array([event.to_json().encode("utf-8")], dtype=np.object_)}
        if event.audio is not None:
            arrays["AUDIO_OUT"] = event.audio
        response = self._pb.InferenceResponse(output_tensors=output_tensors(self._pb, arrays))
        self._responses.put(self._sender, response, 0)

    def close(self) -> None:
        self._responses.put(self._sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonUplinkReply:
    def __init__(self, pb_utils: Any, sender: Any, responses: ResponseThread) -> None:
        self._pb, self._sender, self._responses = pb_utils, sender, responses

    def ok(self) -> None:
        self._responses.put(self._sender, None, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def fail(self, error: DuplexError) -> None:
        code = getattr(self._pb.TritonError, _UPLINK_ERROR_CODES.get(error.code, "INTERNAL"))
        response = self._pb.InferenceResponse(error=self._pb.TritonError(f"[{error.code}] {error.message}", code))
        self._responses.put(self._sender, response, self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class BlsStageClients:
    """StageClients over BLS: decoupled child requests, iterated on the calling thread."""

    def __init__(self, pb_utils: Any, timeout_us: int = 0) -> None:
        self._pb = pb_utils
        self._timeout_us = timeout_us

    def thinker(self, request: ThinkerRequest) -> Iterator[ThinkerUnitResult]:
        return self._stream(THINKER, request, ThinkerUnitResult)

    def talker(self, request: TalkerRequest) -> Iterator[TalkerCodes]:
        return self._stream(TALKER, request, TalkerCodes)

    def code2wav(self, request: Code2WavRequest) -> list[Code2WavAudio]:
        return list(self._stream(CODE2WAV, request, Code2WavAudio))

    def stop(self, stage: str, request_id: str) -> None:
        for _ in self._stream(stage, stop_request(stage, request_id), None):
            pass

    def _stream(self, model: str, request: Any, result_cls: type | None) -> Iterator[Any]:
        names = [spec.name for spec in tensor_specs(result_cls)] if result_cls else []
        bls = self._pb.InferenceRequest(model_name=model, inputs=output_tensors(self._pb, to_arrays(request)),
                                        requested_output_names=names, timeout=self._timeout_us)
        for response in bls.exec(decoupled=True):
            if response.has_error():
                raise StageCallError(model, parse_error_message(response.error().message()))
            if result_cls is None or not response.output_tensors():
                continue
            yield from_arrays(result_cls, _output_getter(self._pb, response))


def _output_getter(pb_utils: Any, response: Any) -> Callable[[str], np.ndarray | None]:
    def get(name: str) -> np.ndarray | None:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        return None if tensor is None else tensor_to_numpy(tensor)

    return get


def manager_config(params: dict[str, str]) -> ManagerConfig:
    return ManagerConfig(max_sessions=int(params["max_sessions"]), idle_timeout_s=float(params["idle_timeout_s"]),
                         max_append_ms=int(params["max_append_ms"]))
