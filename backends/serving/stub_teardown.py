"""Release a model's Triton objects while its stub can still free them.

In the 2.51 stub, `finalize()` is followed by the stub resetting its own instance pointer and
only then dropping the model object. Any backend object that dies with the model (a metric,
a metric family, a response sender that never sent its FINAL, a tensor) calls back into that
pointer from its destructor: the stub segfaults on its way out (`segfault at 60` in the
kernel log) and Triton logs a non-graceful exit. So every `finalize()` ends here: after its
threads are joined, the model's attributes are dropped and the cycles among them collected,
while the stub is still whole.
"""
from __future__ import annotations

import gc
from typing import Any


def release_model_objects(model: Any) -> None:
    vars(model).clear()
    gc.collect()


__all__ = ["release_model_objects"]
