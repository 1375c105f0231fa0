"""Do our tensors survive the Python-backend stub of this interpreter's numpy?

    python scripts/numpy2_stub_probe.py [--expect-numpy 2] [--e2e]

scripts/check_numpy2_stub.sh runs it in a numpy-2 venv (backends/serving/triton_tensors.py says
what breaks there and why); it runs under any numpy. It serves a tiny repository written to a
temporary directory with our own launcher code (the stub and libpython that the real server
gets), three models built from our real tensor code:

  thinker  a stand-in stage with the real ThinkerRequest -> ThinkerUnitResult contract: it
           decodes with `decode_request` and echoes the text fields with `encode_response`.
  front    calls `thinker` over a gRPC stream to the server through the real
           `GrpcStageClients` and answers an EVENT JSON (TYPE_STRING) through `output_tensors`,
           as `duplex` does, with the numpy version its stub imported.
  plain    the stub's own string path (pb_utils.Tensor from an object array): the bug. Its
           EVENT arrives empty under numpy 2 and whole under numpy 1.

`--e2e` then runs the tiny `cpu` server (model_repository) and one duplex conversation with
the client, as the README's demo does, in a scratch workdir. Exit status 0 = every check passed.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from backends.contracts.messages import ThinkerRequest, ThinkerUnitResult
from backends.contracts.tensor_codec import tensor_specs
from backends.serving.server_process import PROJECT_ROOT, ServerOptions, ServerProcess
from backends.serving.profiles import get_profile

TEXT = {"instructions": "Réponds en français 🎙", "initial_user_text": "", "sliding_window_mode": "basic"}
THINKER_PY = '''
import triton_python_backend_utils as pb_utils
from backends.serving.triton_tensors import decode_request, encode_response
from backends.contracts.messages import ThinkerRequest, ThinkerUnitResult
import numpy as np

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            r = decode_request(pb_utils, request, ThinkerRequest)
            text = "|".join([r.action, r.instructions, r.initial_user_text, r.sliding_window_mode])
            empty = np.zeros(0, np.int32)
            result = ThinkerUnitResult(request_id=r.request_id, seq=r.seq, unit_index=0, decision="speak",
                                       token_ids=empty, text=text, tts_token_ids=empty,
                                       tts_hidden=np.zeros((0, 4), np.float32), turn_start=True,
                                       turn_end=False, segment_end=False)
            sender = request.get_response_sender()
            sender.send(encode_response(pb_utils, result))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''
FRONT_PY = '''
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils
from backends.serving.grpc_stages import GrpcStageClients, stage_url
from backends.serving.triton_tensors import output_tensors
from backends.contracts.messages import ThinkerRequest

class TritonPythonModel:
    def initialize(self, args):
        self._stages = GrpcStageClients(stage_url({}))

    def execute(self, requests):
        text = json.loads(json.loads(requests[0].parameters())["text"])
        request = ThinkerRequest(request_id="probe-ü", audio=np.zeros(160, np.float32), seq=3, **text)
        (result,) = list(self._stages.thinker(request))
        event = {"numpy": np.__version__, "python": sys.version.split()[0], "request_id": result.request_id,
                 "seq": result.seq, "decision": result.decision, "text": result.text}
        arrays = {"EVENT": np.array([json.dumps(event, ensure_ascii=False).encode("utf-8")], dtype=np.object_)}
        return [pb_utils.InferenceResponse(output_tensors=output_tensors(pb_utils, arrays)) for _ in requests]

    def finalize(self):
        self._stages.close()
'''
PLAIN_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        event = np.array([b'{"plain": true}'], dtype=np.object_)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EVENT", event)]) for _ in requests]
'''
EVENT_OUT = 'output [ { name: "EVENT" data_type: TYPE_STRING dims: [ 1 ] } ]'


def _block(cls: type, optional: bool) -> str:
    rows = [f'  {{ name: "{s.name}" data_type: {s.triton_dtype} dims: [ {", ".join(map(str, s.dims))} ]'
            + (" optional: true" if optional and s.optional else "") + " }" for s in tensor_specs(cls)]
    return ",\n".join(rows)


def _model(repo: Path, name: str, code: str, body: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{body}\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n')


def write_repository(repo: Path) -> None:
    shutil.rmtree(repo, ignore_errors=True)
    stage = (f"model_transaction_policy {{ decoupled: true }}\ninput [\n{_block(ThinkerRequest, True)}\n]\n"
             f"output [\n{_block(ThinkerUnitResult, False)}\n]")
    _model(repo, "thinker", THINKER_PY, stage)
    _model(repo, "front", FRONT_PY, f"input [ ]\n{EVENT_OUT}")
    _model(repo, "plain", PLAIN_PY, f"input [ ]\n{EVENT_OUT}")


def _event(client: httpclient.InferenceServerClient, model: str, **params: object) -> bytes | None:
    result = client.infer(model, [], parameters=params or None)
    size = result.get_response()["outputs"][0].get("parameters", {}).get("binary_data_size")
    return None if size == 0 else result.as_numpy("EVENT")[0]


def probe(workdir: Path, expect_numpy: str | None) -> list[str]:
    """Serve the probe repository; the list of failed checks (empty = all passed)."""
    repo = workdir / "probe_repository"
    write_repository(repo)
    # No `health` action here: the stand-in thinker is the only stage.
    options = ServerOptions(profile=get_profile("cpu"), repository=repo, workdir=workdir, ready_timeout_s=120,
                            stage_health=False)
    with ServerProcess(options) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        front, plain = _event(client, "front", text=json.dumps(TEXT)), _event(client, "plain")
    failed = []
    event = json.loads(front) if front else {}
    print(f"stub: numpy {event.get('numpy')}, python {event.get('python')}; front EVENT {front!r}")
    print(f"stub's own string path (plain): {plain!r}")
    want = {"request_id": "probe-ü", "seq": 3, "decision": "speak", "text": "|".join(["run", *TEXT.values()])}
    if {k: event.get(k) for k in want} != want:
        failed.append(f"front: stage strings or EVENT did not survive: {front!r}, wanted {want}")
    if expect_numpy and not str(event.get("numpy", "")).startswith(f"{expect_numpy}."):
        failed.append(f"the stub imported numpy {event.get('numpy')}, not {expect_numpy}.x")
    if event.get("numpy", "").startswith("1.") and plain is None:
        failed.append("plain: the stub's own string path failed under numpy 1")
    return failed


def conversation(workdir: Path) -> list[str]:
    from client.cli import main as client_main

    options = ServerOptions(profile=get_profile("cpu"), workdir=workdir, ready_timeout_s=300)
    # Random weights rarely end a reply by themselves: force 3 units so the turn completes.
    reply = ["--reply-units", "3", "--reply-tokens-per-unit", "4"]
    with ServerProcess(options) as server:
        print(f"cpu server ready on {server.grpc_url} (log {server.log_file})", flush=True)
        code = client_main(["--url", server.grpc_url, "--input", str(PROJECT_ROOT / "client/data/hello_16k.wav"),
                            "--output", str(workdir / "reply.wav"), *reply, "--quiet",
                            "--initial-user-text", "Hello! Please tell me about the weather today."])
    return [] if code == 0 and (workdir / "reply.wav").stat().st_size > 44 else [f"conversation: exit {code}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--expect-numpy", help="major version the stub must import, e.g. 2")
    parser.add_argument("--e2e", action="store_true", help="also hold a duplex conversation on the cpu profile")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="numpy2-stub-"))
    print(f"probe: python {sys.version.split()[0]}, numpy {np.__version__}, workdir {workdir}", flush=True)
    failed = probe(workdir, args.expect_numpy)
    if args.e2e and not failed:
        failed += conversation(workdir)
    for line in failed:
        print(f"FAILED {line}")
    print("numpy2 stub probe:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
