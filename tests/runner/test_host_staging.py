"""Host staging on CPU: values and persistent destination addresses (pinning needs CUDA).

Strategy: copies must carry the exact values, and `copy_to_device` must write in place;
`PinnedStaging` must hand out its twins in turn, publish exactly the twin it handed out, and
never move the buffer.
"""

from __future__ import annotations

import numpy as np
import torch

import pytest

from backends.runner.host_staging import (
    PinnedStaging,
    copy_to_device,
    to_device,
    to_device_packed,
)


def test_to_device_and_copy_in_place() -> None:
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert to_device(array, "cpu").tolist() == array.tolist()
    dst = torch.zeros(6, dtype=torch.int64)
    address = dst.data_ptr()
    copy_to_device(dst, array)
    assert dst.tolist() == list(range(6)) and dst.data_ptr() == address


def test_packed_arrays_keep_values_shapes_and_dtypes() -> None:
    """The one-copy path is CUDA's (tests/runner_gpu); on CPU each array comes back as is."""
    arrays = [np.array([[True, False]]), np.arange(3, dtype=np.int64), np.ones(2, np.float32)]
    for array, tensor in zip(arrays, to_device_packed(arrays, "cpu")):
        assert tensor.dtype == torch.from_numpy(array).dtype
        assert np.array_equal(tensor.numpy(), array)


def test_pinned_staging_alternates_twins_and_publishes_in_place() -> None:
    buffer = torch.full((2, 3), -1, dtype=torch.int64)
    address = buffer.data_ptr()
    staging = PinnedStaging(buffer)
    first = staging.host()
    assert first.shape == (2, 3) and staging.host() is not None
    first[:] = np.arange(6).reshape(2, 3)
    staging.publish()
    assert buffer.tolist() == [[0, 1, 2], [3, 4, 5]] and buffer.data_ptr() == address
    second = staging.host()
    assert not np.shares_memory(first, second)  # the device may still read the first
    second[:] = 7
    staging.publish()
    assert buffer.tolist() == [[7] * 3] * 2
    third = staging.host()
    assert np.shares_memory(first, third)  # back to the first twin: stale until rewritten
    assert third.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_pinned_staging_rejects_no_twins() -> None:
    with pytest.raises(ValueError, match="depth"):
        PinnedStaging(torch.zeros(1), depth=0)
