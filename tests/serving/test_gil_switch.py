"""MINICPMO_GIL_SWITCH_S sets the model processes' GIL switch interval (backends/serving/gil_switch.py)."""
from __future__ import annotations

import sys

import pytest

from backends.serving.gil_switch import SWITCH_ENV, configure_switch_interval


@pytest.fixture(autouse=True)
def restore_interval():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_unset_leaves_the_interval_alone():
    sys.setswitchinterval(0.004)
    assert configure_switch_interval({}) == pytest.approx(0.004)
    assert configure_switch_interval({SWITCH_ENV: " "}) == pytest.approx(0.004)


def test_a_value_in_seconds_is_applied():
    assert configure_switch_interval({SWITCH_ENV: "0.0005"}) == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)


@pytest.mark.parametrize("value", ["0", "-1", "2", "fast"])
def test_a_bad_value_is_refused_and_changes_nothing(value):
    sys.setswitchinterval(0.004)
    with pytest.raises(ValueError):
        configure_switch_interval({SWITCH_ENV: value})
    assert sys.getswitchinterval() == pytest.approx(0.004)
