"""When the decode kernels launch with programmatic dependent launch (`backends.runner.pdl`).

The kernel's PDL flag and Triton's `launch_pdl` option must always come together (a kernel
launched with PDL but compiled without its wait would race its predecessor): on the CPU
(the interpreter) and on GPUs older than Hopper, neither is set. The GPU side (same bits with
and without PDL) is tests/runner_gpu/test_gpu_pdl.py.
"""

from __future__ import annotations

import torch

from backends.runner.pdl import capability_major, pdl_launch_args, use_pdl


def test_cpu_launches_without_pdl() -> None:
    assert not use_pdl(torch.device("cpu"))
    assert pdl_launch_args(torch.device("cpu")) == {"PDL": False}


def test_capability_decides_on_cuda(monkeypatch) -> None:
    for major, expected in ((8, False), (9, True), (10, True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, m=major: (m, 0))
        capability_major.cache_clear()
        args = pdl_launch_args(torch.device("cuda", 0))
        assert args == ({"PDL": True, "launch_pdl": True} if expected else {"PDL": False})
    capability_major.cache_clear()
