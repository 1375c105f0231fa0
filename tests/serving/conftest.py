"""A fresh fake `triton_python_backend_utils` (tests/serving/fake_pb_utils.py) per test."""
import pytest

import fake_pb_utils


@pytest.fixture
def pb():
    fake_pb_utils.reset()
    yield fake_pb_utils
    fake_pb_utils.reset()
