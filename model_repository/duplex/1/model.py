"""Triton adapter of the `duplex` orchestrator (BLS): sessions by sequence id."""
import triton_python_backend_utils as pb_utils

from backends.duplex.session_manager import SessionManager
from backends.serving.triton_duplex import (
    BlsStageClients, TritonDownlink, TritonUplinkReply, is_sequence_release, manager_config, raw_uplink,
)
from backends.serving.metrics_duplex import DuplexMetrics
from backends.serving.metrics_thread import MetricsThread
from backends.serving.resource_gauges import ResourceGauges
from backends.serving.triton_responses import ResponseThread
from backends.serving.triton_stage import model_parameters


class TritonPythonModel:
    def initialize(self, args):
        self._name = args["model_name"]
        self._responses = ResponseThread(pb_utils, "duplex-responses")
        # One thread per process calls the metric API (triton_notes 0.9): the gauges run on it too.
        metrics = MetricsThread(pb_utils, "duplex", args.get("model_instance_name", ""))
        self._metrics = DuplexMetrics(metrics)
        gauges = ResourceGauges(pb_utils, "duplex")
        self._manager = SessionManager(manager_config(model_parameters(args)), BlsStageClients(pb_utils),
                                       observer=lambda counts: metrics.call(gauges.publish, counts))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            if is_sequence_release(request):  # our own END for a dead session: nothing to do
                self._responses.put(sender, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            sequence = (self._name, request.correlation_id())
            self._manager.handle(
                raw_uplink(pb_utils, request),
                self._metrics.uplink_reply(TritonUplinkReply(pb_utils, sender, self._responses)),
                lambda sender=sender, sequence=sequence: self._metrics.downlink(
                    TritonDownlink(pb_utils, sender, self._responses, sequence)),
            )
        return None

    def finalize(self):
        self._manager.shutdown()
        self._responses.shutdown()
        self._metrics.shutdown()
