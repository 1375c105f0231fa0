"""The suite's `interpreter` mark: tests that put CPU tensors through Triton kernels skip where
Triton's interpreter is off (a machine with CUDA), except those also marked `gpu`, which run
the compiled kernels there. tests/conftest.py applies it at collection."""
from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

SKIP = pytest.mark.skip(reason="CPU tensors through Triton kernels: needs Triton's interpreter "
                               "(TRITON_INTERPRET=1, the default where there is no CUDA)")


def skip_where_the_interpreter_is_off(items: Iterable[pytest.Item]) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    for item in items:
        if item.get_closest_marker("interpreter") and not item.get_closest_marker("gpu"):
            item.add_marker(SKIP)
