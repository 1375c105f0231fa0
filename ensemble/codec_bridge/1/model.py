"""Triton adapter of the ensemble's codec bridge: one Talker group in, its Code2Wav windows out.

The work is tiny and order matters (Code2Wav checks chunk_seq), so `execute` answers each
request in turn on the calling thread: every window as one response, then the FINAL flag.
When a condition finishes, the Talker request is stopped over BLS (its KV stays reserved
until then; backends/stages/codec_bridge.py says why the bridge cannot see turn ends).
"""
import logging

import triton_python_backend_utils as pb_utils

from backends.contracts.errors import StageError
from backends.contracts.messages import TalkerCodes
from backends.serving.triton_duplex import BlsStageClients
from backends.serving.triton_responses import triton_error
from backends.serving.triton_tensors import ContractError, decode_request, encode_response
from backends.stages.codec_bridge import CodecBridge

_LOG = logging.getLogger(__name__)


class TritonPythonModel:
    def initialize(self, args):
        self._bridge = CodecBridge()
        self._stages = BlsStageClients(pb_utils)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._answer(request, sender)
            except ContractError as exc:
                self._fail(sender, StageError("invalid_argument", str(exc)))
            except Exception as exc:  # one bad group must not take the step down
                _LOG.exception("codec_bridge request failed")
                self._fail(sender, StageError("internal", f"{type(exc).__name__}: {exc}"))
        return None

    def _answer(self, request, sender):
        group = decode_request(pb_utils, request, TalkerCodes)
        output = self._bridge.on_codes(group)
        for window in output.windows:
            sender.send(encode_response(pb_utils, window))
        if output.utterance_ended:
            self._stages.stop("talker", group.request_id)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _fail(self, sender, error):
        response = pb_utils.InferenceResponse(error=triton_error(pb_utils, error))
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
