"""Triton adapter of the code2wav stage: decode requests, hand them to the engine thread."""
import triton_python_backend_utils as pb_utils

from backends.contracts.messages import Code2WavRequest
from backends.serving.stub_teardown import release_model_objects
from backends.serving.triton_stage import StageAdapter, apply_memory_fraction, model_parameters
from backends.stages.factory import build_code2wav_engine


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        device_id = args.get("model_instance_device_id", "0")
        apply_memory_fraction(params, device_id)
        engine = build_code2wav_engine(params, device_id)
        self._adapter = StageAdapter(pb_utils, "code2wav", Code2WavRequest, engine, params,
                                     args.get("model_instance_name", ""))

    def execute(self, requests):
        return self._adapter.execute(requests)

    def finalize(self):
        self._adapter.finalize()
        release_model_objects(self)
