"""Triton adapter of the `duplex` orchestrator (BLS): sessions by sequence id."""
import triton_python_backend_utils as pb_utils

from backends.duplex.session_manager import SessionManager
from backends.serving.triton_duplex import (
    BlsStageClients, TritonDownlink, TritonUplinkReply, manager_config, raw_uplink,
)
from backends.serving.triton_responses import ResponseThread
from backends.serving.triton_stage import model_parameters


class TritonPythonModel:
    def initialize(self, args):
        self._responses = ResponseThread(pb_utils, "duplex-responses")
        self._manager = SessionManager(manager_config(model_parameters(args)), BlsStageClients(pb_utils))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            self._manager.handle(
                raw_uplink(pb_utils, request),
                TritonUplinkReply(pb_utils, sender, self._responses),
                lambda sender=sender: TritonDownlink(pb_utils, sender, self._responses),
            )
        return None

    def finalize(self):
        self._manager.shutdown()
        self._responses.shutdown()
