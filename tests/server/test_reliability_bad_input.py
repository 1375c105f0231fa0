"""Bad input, generated: random tensors (names, dtypes, shapes, sizes), random request parameters
(unicode, huge strings, wrong types), actions and sequence flags, sent to `duplex` and to each
stage model directly on the reliability server.

Property: every request is answered (an error or a normal answer, always ending in a FINAL);
every error is clear (a message, never the `internal` code that marks a bug of ours); the
server keeps all its stub processes; afterwards the stage tables are back at their baseline
and a valid session still works. Stage requests are mutations of a valid contract request, so
they reach past Triton's own dtype/shape checks into our decoding and engine validation (they
carry the server's stage secret, as the orchestrator's requests do: without it a stage refuses
them before decoding, tests/server/test_stage_guard.py); the ids they use are stopped at the end
(a valid-by-chance request may open engine state).
Examples are bounded and derandomized so that the module stays well under two minutes.
"""
from __future__ import annotations

import json
import queue
import uuid
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_resources import settled, warm_baseline

from backends.checkpoint.tiny_config import TINY_HIDDEN
from backends.contracts.messages import Code2WavRequest, TalkerRequest, ThinkerRequest, stop_request
from backends.contracts.tensor_codec import to_arrays
from backends.serving.stage_secret import secret_parameters
from client.stream_close import stop_stream

ANSWER_TIMEOUT_S = 30.0
DUPLEX_EXAMPLES = 60
STAGE_EXAMPLES = 30
INTERNAL = "[internal]"  # the code our errors carry for an unexpected exception: a bug
TRITON_DTYPES = {np.int8: "INT8", np.int16: "INT16", np.int32: "INT32", np.int64: "INT64", np.uint8: "UINT8",
                 np.float16: "FP16", np.float32: "FP32", np.float64: "FP64", np.bool_: "BOOL", np.object_: "BYTES"}
HUGE = "ü" * 100_000
TEXT = st.one_of(st.text(max_size=40), st.just(HUGE), st.just(""), st.just("\x00\ud7ff🎙"))
VALUES = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
                   st.booleans(), TEXT)
DUPLEX_PARAMS = ("action", "sample_rate", "temperature", "seed", "reply_units", "reply_tokens_per_unit",
                 "instructions", "initial_user_text", "voice", "force_listen_count", "sliding_window_mode",
                 "no_such_knob", "triton_anything")
ACTIONS = st.sampled_from(["append", "commit", "cancel", "run", "stop", "health", "", "dance", HUGE[:300]])


@dataclass
class Answer:
    error: str | None = None
    events: tuple[dict, ...] = ()


class AnswerStream:
    """One gRPC stream; answers are read per request id, up to that request's FINAL."""

    def __init__(self, url: str, stage_secret: str | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.stage_parameters = secret_parameters(stage_secret) or None  # what stage requests carry
        self._items: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self._items.put((result, error)))

    def send(self, model: str, inputs: list, **kwargs: object) -> str:
        request_id = f"hyp-{uuid.uuid4().hex[:10]}"
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True,
                                       **kwargs)
        return request_id

    def answer(self, request_id: str, until_first: bool = False) -> Answer:
        """Events and error of `request_id` up to its FINAL (or its first response)."""
        events: list[dict] = []
        while True:
            result, error = self._items.get(timeout=ANSWER_TIMEOUT_S)
            if error is not None:  # tritonclient 2.51 drops the id of in-band errors: ours
                return Answer(str(error), tuple(events))
            response = result.get_response()
            if response.id != request_id:
                continue
            if result.as_numpy("EVENT") is not None:
                events.append(json.loads(result.as_numpy("EVENT")[0]))
            if until_first or response.parameters["triton_final_response"].bool_param:
                return Answer(None, tuple(events))

    def close(self) -> None:
        stop_stream(self.client, cancel=True)
        self.client.close()


def _array(dtype: type, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data of `dtype` and `shape` (np.asarray: a () shape gives a 0-d array, not a scalar)."""
    if dtype is np.object_:
        return np.array([rng.bytes(int(rng.integers(0, 8))) for _ in range(int(np.prod(shape)))],
                        dtype=np.object_).reshape(shape)
    if dtype is np.bool_:
        return np.asarray(rng.integers(0, 2, shape)).astype(np.bool_)
    return np.asarray(rng.standard_normal(shape) * 1000).astype(dtype)


def _input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), TRITON_DTYPES[array.dtype.type])
    tensor.set_data_from_numpy(array)
    return tensor


def _is_clear(answer: Answer) -> bool:
    if answer.error is not None:
        return bool(answer.error.strip()) and INTERNAL not in answer.error
    return all(e.get("code") != "internal" and e.get("message") for e in answer.events if e["type"] == "error")


SHAPES = st.one_of(st.sampled_from([(0,), (1,), (160,), (16000,), (48000,), (170000,)]),
                   st.lists(st.integers(0, 4), min_size=2, max_size=3).map(tuple), st.just(()))
DTYPES = st.sampled_from(list(TRITON_DTYPES))
DUPLEX_TENSORS = st.lists(st.tuples(st.sampled_from(["AUDIO", "REF_AUDIO", "EVENT", "junk"]), DTYPES, SHAPES),
                          max_size=3)


@pytest.fixture(scope="module")
def answers(reliability_server):
    stream = AnswerStream(reliability_server.grpc_url, reliability_server.stage_secret)
    yield stream
    stream.close()


@pytest.fixture(scope="module")
def used_ids() -> dict[str, set[str]]:
    """Stage request ids the examples sent, stopped at the end of the module."""
    return {"thinker": set(), "talker": set(), "code2wav": set()}


def _duplex(stream: AnswerStream, inputs: list, sid: object, start: bool, end: bool, params: dict) -> Answer:
    request_id = stream.send("duplex", inputs, sequence_id=sid, sequence_start=start, sequence_end=end,
                             parameters=params or None)
    first = stream.answer(request_id, until_first=True)
    admitted = first.error is None and first.events and first.events[0]["type"] == "session.created"
    if not admitted:
        return first if first.error is not None or not first.events else _rest(stream, request_id, first)
    if not end:  # close the session at once: examples must not leave sessions behind
        stream.send("duplex", [], sequence_id=sid, sequence_end=True)
    return _rest(stream, request_id, first)


def _rest(stream: AnswerStream, request_id: str, first: Answer) -> Answer:
    rest = stream.answer(request_id)
    return Answer(rest.error, first.events + rest.events)


@settings(max_examples=DUPLEX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(tensors=DUPLEX_TENSORS, params=st.dictionaries(st.sampled_from(DUPLEX_PARAMS), VALUES | ACTIONS, max_size=4),
       sid=st.sampled_from(["hyp-a", "hyp-b", "", "hyp-ü🎙", 7, 0]), start=st.booleans(), end=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_duplex_answers_every_bad_request_clearly(answers, baseline, tensors, params, sid, start, end, seed):
    rng = np.random.default_rng(seed)
    inputs = [_input(name, _array(dtype, shape, rng)) for name, dtype, shape in tensors]
    answer = _duplex(answers, inputs, sid, start, end, params)
    assert _is_clear(answer), answer


def _template(stage: str, request_id: str):
    """A valid request of `stage` that the mutations start from."""
    if stage == "thinker":  # an append to an unknown request: refused by the engine
        return ThinkerRequest(request_id=request_id, audio=np.zeros(16000, np.float32), seq=1)
    if stage == "talker":
        return TalkerRequest(request_id=request_id, condition_seq=0, token_ids=np.array([5, 6], np.int32),
                             hidden=np.zeros((2, TINY_HIDDEN), np.float32), turn_start=True)
    return Code2WavRequest(request_id, 0, 0, np.arange(28, dtype=np.int32), 3, False)


MUTATIONS = st.lists(st.tuples(st.sampled_from(["drop", "dtype", "shape", "value", "junk"]),
                               st.integers(0, 20), DTYPES, SHAPES, VALUES | ACTIONS), min_size=1, max_size=2)


def _mutate(arrays: dict[str, np.ndarray], mutation: tuple, rng: np.random.Generator) -> None:
    kind, index, dtype, shape, value = mutation
    name = sorted(arrays)[index % len(arrays)] if arrays else "REQUEST_ID"
    if kind == "drop":
        arrays.pop(name, None)
    elif kind == "dtype" and name in arrays:
        arrays[name] = _array(dtype, arrays[name].shape, rng)
    elif kind == "shape":
        arrays[name] = _array(arrays[name].dtype.type if name in arrays else dtype, shape, rng)
    elif kind == "junk":
        arrays[f"JUNK_{index}"] = _array(dtype, shape, rng)
    elif name in arrays and arrays[name].dtype == np.uint8 and arrays[name].ndim == 1:  # a text field
        arrays[name] = np.frombuffer(str(value).encode("utf-8", "surrogatepass"), np.uint8).copy()  # maybe not UTF-8
    elif name in arrays and arrays[name].size == 1:  # a scalar field gets a value of any type
        arrays[name] = _scalar(value, arrays[name].dtype.type)


def _scalar(value: object, dtype: type) -> np.ndarray:
    if dtype is np.object_ or isinstance(value, str):
        return np.array([str(value).encode("utf-8", "surrogatepass")], dtype=np.object_)
    try:
        return np.array([value], dtype=dtype)
    except (OverflowError, ValueError):
        return np.array([str(value).encode()], dtype=np.object_)


def _text(array: np.ndarray | None) -> str | None:
    """A request id as a stage would read it (UTF-8 bytes as uint8 [n], or one BYTES element)."""
    if array is not None and array.dtype == np.uint8 and array.ndim == 1:
        return array.tobytes().decode("utf-8", "replace")
    if array is not None and array.dtype == np.object_ and array.size == 1:
        return bytes(array.reshape(-1)[0]).decode("utf-8", "replace")
    return None


def _stage_example(stream: AnswerStream, used: set[str], stage: str, mutations: list, seed: int) -> Answer:
    rng = np.random.default_rng(seed)
    arrays = to_arrays(_template(stage, f"hyp-{stage}-{seed}"))
    for mutation in mutations:
        _mutate(arrays, mutation, rng)
    request_id = _text(arrays.get("REQUEST_ID"))
    if request_id is not None:
        used.add(request_id)
    inputs = [_input(name, array) for name, array in arrays.items()]
    return stream.answer(stream.send(stage, inputs, parameters=stream.stage_parameters))


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
@settings(max_examples=STAGE_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(mutations=MUTATIONS, seed=st.integers(0, 2**32 - 1))
def test_stages_answer_every_bad_request_clearly(answers, baseline, used_ids, stage, mutations, seed):
    answer = _stage_example(answers, used_ids[stage], stage, mutations, seed)
    assert _is_clear(answer), answer


def test_after_the_bad_input_nothing_is_held_and_a_session_works(reliability_server, answers, baseline, used_ids):
    for stage, request_ids in used_ids.items():
        for request_id in request_ids:
            inputs = [_input(name, array) for name, array in to_arrays(stop_request(stage, request_id)).items()]
            answer = answers.answer(answers.send(stage, inputs, parameters=answers.stage_parameters))
            assert answer.error is None, answer
    after = settled(reliability_server, baseline)
    assert after.tracked() == baseline.tracked()
    assert after.stubs == baseline.stubs, "a stub process died"
    warm_baseline(reliability_server)  # a full conversation through all three stages
