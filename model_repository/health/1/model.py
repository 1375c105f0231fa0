"""Triton adapter of the `health` model: asks every stage whether it can serve."""
import triton_python_backend_utils as pb_utils

from backends.serving.health_model import HealthModel
from backends.serving.triton_stage import model_parameters


class TritonPythonModel:
    def initialize(self, args):
        self._model = HealthModel(pb_utils, model_parameters(args))

    def execute(self, requests):
        return self._model.execute(requests)
