"""Triton adapter of the `duplex` orchestrator: sessions by sequence id. It calls the stages
over gRPC streams to its own server, not BLS (backends/serving/grpc_stages.py says why)."""
import triton_python_backend_utils as pb_utils

from backends.duplex.session_manager import SessionManager
from backends.serving.grpc_stages import GrpcStageClients, stage_url
from backends.serving.triton_duplex import (
    TritonDownlink, TritonUplinkReply, is_health_probe, is_sequence_release, manager_config, raw_uplink,
)
from backends.serving.metrics_duplex import DuplexMetrics
from backends.serving.metrics_stage_calls import with_call_metrics
from backends.serving.metrics_thread import MetricsThread
from backends.serving.resource_gauges import ResourceGauges
from backends.serving.stack_dump import enable_stack_dump
from backends.serving.stack_sampler import start_stack_sampler
from backends.serving.stage_secret import configured_secret
from backends.serving.stub_teardown import release_model_objects
from backends.serving.triton_responses import ResponseThread
from backends.serving.triton_stage import model_parameters


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dump()
        self._sampler = start_stack_sampler("duplex")  # off unless DUPLEX_STACK_SAMPLES_DIR is set
        self._name = args["model_name"]
        self._responses = ResponseThread(pb_utils, "duplex-responses")
        # One thread per process calls the metric API (docs/triton_behaviours.md#custom-metrics):
        # the gauges run on it too.
        metrics = MetricsThread(pb_utils, "duplex", args.get("model_instance_name", ""))
        self._metrics = DuplexMetrics(metrics)
        self._metrics_thread = metrics
        self._gauges = gauges = ResourceGauges(pb_utils, "duplex")
        params = model_parameters(args)
        # Every stage request carries the server's stage secret (MINICPMO_STAGE_SECRET_FILE).
        self._stages = GrpcStageClients(stage_url(params), secret=configured_secret())
        stages = with_call_metrics(self._stages, metrics)  # off unless MINICPMO_STAGE_CALL_METRICS=1
        self._manager = SessionManager(manager_config(params), stages, observer=lambda counts: metrics.call(
            gauges.publish, {**counts, **self._stages.pool_gauges()}))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            # Our own END for a dead session, or a readiness probe: an empty FINAL, no session.
            if is_sequence_release(request) or is_health_probe(pb_utils, request):
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
        self._stages.close()
        self._responses.shutdown()
        self._metrics_thread.call(self._gauges.close)  # queued before the thread's stop
        self._metrics.shutdown()
        if self._sampler is not None:
            self._sampler.stop()
        release_model_objects(self)
