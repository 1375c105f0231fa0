"""Suite-wide settings: one torch thread per process; Triton kernels interpreted on CPU.

The CI machine has two cores shared with tritonserver and its stage processes; the tiny
models' matmuls lose far more to thread hand-off than they gain (10-20x slower steps were
measured with the default pool under load).

Tests that put CPU tensors through Triton kernels carry the `interpreter` mark (a module's
`pytestmark` may carry it for all its tests): where the interpreter is off, on a machine with
CUDA, they skip, except those also marked `gpu`, which run the compiled kernels there.
"""
import os

import pytest
import torch

torch.set_num_threads(1)

# Without CUDA the Triton-language kernels run in Triton's interpreter; the variable must be
# set before anything imports triton (test modules of other packages may do so first).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    skip = pytest.mark.skip(reason="CPU tensors through Triton kernels: needs Triton's interpreter "
                                   "(TRITON_INTERPRET=1, the default where there is no CUDA)")
    for item in items:
        if item.get_closest_marker("interpreter") and not item.get_closest_marker("gpu"):
            item.add_marker(skip)
