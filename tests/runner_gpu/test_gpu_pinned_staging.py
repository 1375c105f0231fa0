"""`PinnedStaging` on a GPU: a twin is never rewritten while the device may still read it; and
`to_device_packed`: several arrays through one copy, each its own view.

Strategy: the stream is held busy (`torch.cuda._sleep`) so every queued copy is still pending
when the host stages the next values. Three publishes in a row reuse the first twin on the
third; after each publish a device-side snapshot of the buffer is queued. If `host()` handed the
first twin back without waiting for its copy, the first snapshot would see the third values.
Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from backends.runner.host_staging import PinnedStaging  # noqa: E402

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU clock: far longer than the host's three stagings


def test_third_publish_waits_for_the_first_copy() -> None:
    buffer = torch.zeros(4096, dtype=torch.int64, device="cuda")
    staging = PinnedStaging(buffer)
    snapshots = []
    torch.cuda._sleep(SLEEP_CYCLES)  # every copy below queues behind this
    for value in (1, 2, 3):
        twin = staging.host()  # the third call must wait for the first copy to have run
        twin[:] = value
        staging.publish()
        snapshots.append(buffer.clone())
    torch.cuda.synchronize()
    assert [int(s.min()) for s in snapshots] == [1, 2, 3]
    assert [int(s.max()) for s in snapshots] == [1, 2, 3]
    assert buffer.data_ptr() == staging.buffer.data_ptr()


def test_packed_copy_gives_each_array_as_its_own_view() -> None:
    """`to_device_packed`: mixed dtypes and odd sizes through one copy; each result has its
    array's shape, dtype and values, all views of one device block (8-byte aligned parts)."""
    import numpy as np

    from backends.runner.host_staging import to_device_packed

    rng = np.random.default_rng(0)
    arrays = [rng.random((3, 5)) < 0.5, np.arange(7, dtype=np.int64), rng.integers(0, 9, (2, 3)),
              np.arange(3, dtype=np.int32), np.zeros((0, 4), dtype=np.int64),
              rng.random(5).astype(np.float32)]
    torch.cuda._sleep(SLEEP_CYCLES)  # the copy is still queued when the host returns
    tensors = to_device_packed(arrays, "cuda")
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    for array, tensor in zip(arrays, tensors):
        assert tensor.is_cuda and tuple(tensor.shape) == array.shape
        assert tensor.dtype == torch.from_numpy(array).dtype
        assert np.array_equal(tensor.cpu().numpy(), array)
    assert len(storages) == 1
