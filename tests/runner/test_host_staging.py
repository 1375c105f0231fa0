"""Host staging on CPU: values and persistent destination addresses (pinning needs CUDA).

Strategy: copies must carry the exact values, and `copy_to_device` must write in place.
"""

from __future__ import annotations

import numpy as np
import torch

from backends.runner.host_staging import copy_to_device, to_device


def test_to_device_and_copy_in_place() -> None:
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert to_device(array, "cpu").tolist() == array.tolist()
    dst = torch.zeros(6, dtype=torch.int64)
    address = dst.data_ptr()
    copy_to_device(dst, array)
    assert dst.tolist() == list(range(6)) and dst.data_ptr() == address
