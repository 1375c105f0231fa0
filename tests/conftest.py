"""Suite-wide settings: one torch thread per process; Triton kernels interpreted on CPU.

The CI machine has two cores shared with tritonserver and its stage processes; the tiny
models' matmuls lose far more to thread hand-off than they gain (10-20x slower steps were
measured with the default pool under load).

Tests that put CPU tensors through Triton kernels carry the `interpreter` mark: where the
interpreter is off, on a machine with CUDA, they skip (tests/interpreter_mark.py).
"""
import os

import pytest
import torch
from interpreter_mark import skip_where_the_interpreter_is_off

torch.set_num_threads(1)

# Without CUDA the Triton-language kernels run in Triton's interpreter; the variable must be
# set before anything imports triton (test modules of other packages may do so first).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_where_the_interpreter_is_off(items)
