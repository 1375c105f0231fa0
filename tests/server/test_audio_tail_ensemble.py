"""The `audio_tail` ensemble (ensemble/README.md) on a real tritonserver: talker ->
codec_bridge -> code2wav, streamed over gRPC.

Strategy: its own server (the shared `server` fixture serves model_repository alone, and the
ensemble needs a second repository and explicit loading): the rendered talker and code2wav
models plus ensemble/, loaded by name, as the README says. One mid-turn condition yields exactly
25 frames, so the audio is known exactly: a first window (20160 samples) and the final flush of
the look-ahead (3840 held + 3 x 960). The same request id sent again must stream again (the
bridge stops the Talker request and moves Code2Wav to the next epoch).
"""
from __future__ import annotations

import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from backends.contracts.tensor_codec import encode_text
from backends.serving.launcher import DEFAULT_REPOSITORY, PROJECT_ROOT, ServerOptions, ServerProcess
from backends.serving.profiles import get_profile
from backends.serving.repository import render_repository

ENSEMBLE_REPOSITORY = PROJECT_ROOT / "ensemble"
MODELS = ("talker", "code2wav", "codec_bridge", "audio_tail")
TINY_LLM_DIM = 64  # the tiny checkpoint's tts_config.llm_dim
RESPONSE_TIMEOUT_S = 60.0
EXPECTED_CHUNKS = [(0, 20160), (1, 3840 + 3 * 960)]


@pytest.fixture(scope="module")
def ensemble_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("ensemble")
    profile = get_profile("cpu")
    rendered = render_repository(DEFAULT_REPOSITORY, work / "rendered", profile)
    stages = work / "stages"
    for name in ("talker", "code2wav"):
        shutil.copytree(rendered / name, stages / name)
    options = ServerOptions(
        profile=profile, repository=stages, workdir=PROJECT_ROOT / "var",
        log_file=work / "server.log",
        extra_args=[f"--model-repository={ENSEMBLE_REPOSITORY}", "--model-control-mode=explicit",
                    *(f"--load-model={name}" for name in MODELS)],
    )
    with ServerProcess(options) as proc:
        yield proc


def _utterance(url: str, request_id: str) -> list[tuple[int, int]]:
    """One mid-turn condition through the ensemble -> [(chunk_seq, samples)] in order."""
    rng = np.random.default_rng(0)
    arrays = {
        "REQUEST_ID": encode_text(request_id),
        "CONDITION_SEQ": np.array([0], dtype=np.int64),
        "TOKEN_IDS": rng.integers(10, 40, 6).astype(np.int32),
        "HIDDEN": rng.standard_normal((6, TINY_LLM_DIM)).astype(np.float32),
        "TURN_START": np.array([False]),
        "TURN_END": np.array([False]),
    }
    dtypes = {np.uint8: "UINT8", np.int64: "INT64", np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL"}
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtypes[array.dtype.type])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("audio_tail", inputs, request_id=request_id,
                                  enable_empty_final_response=True)
        return _collect(responses, request_id)
    finally:
        client.stop_stream()
        client.close()


def _collect(responses: queue.Queue, request_id: str) -> list[tuple[int, int]]:
    chunks = []
    while True:
        result, error = responses.get(timeout=RESPONSE_TIMEOUT_S)
        assert error is None, error
        response = result.get_response()
        if response.outputs:  # the last chunk may come on the FINAL response itself
            assert response.id == request_id
            audio = result.as_numpy("AUDIO")
            assert audio.dtype == np.float32 and np.isfinite(audio).all()
            chunks.append((int(result.as_numpy("CHUNK_SEQ")[0]), audio.shape[0]))
        if response.parameters["triton_final_response"].bool_param:
            return chunks


def test_a_condition_streams_its_audio_through_the_ensemble(ensemble_server) -> None:
    assert _utterance(ensemble_server.grpc_url, "u0") == EXPECTED_CHUNKS


def test_a_returning_request_id_streams_again(ensemble_server) -> None:
    for _ in range(2):
        assert _utterance(ensemble_server.grpc_url, "u1") == EXPECTED_CHUNKS
