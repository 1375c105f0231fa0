"""Contract types: validation messages name the bad value; derived sizes are computed."""

from __future__ import annotations

import pytest
import torch

from backends.runner.types import RunnerConfig, StepInput


def test_runner_config_defaults_and_derived_capacity() -> None:
    config = RunnerConfig(num_blocks=8, max_num_reqs=2, max_model_len=33)
    assert (config.block_size, config.device, config.dtype) == (16, "cpu", torch.float32)
    assert config.max_blocks_per_req == 3


@pytest.mark.parametrize(
    "overrides,name",
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"max_num_reqs": -1}, "max_num_reqs"),
        ({"max_model_len": 2.5}, "max_model_len"),
        ({"block_size": 0}, "block_size"),
        ({"dtype": torch.int32}, "dtype"),
    ],
)
def test_runner_config_rejects_bad_values(overrides: dict[str, object], name: str) -> None:
    settings: dict[str, object] = dict(num_blocks=8, max_num_reqs=2, max_model_len=32)
    settings.update(overrides)
    with pytest.raises(ValueError, match=name):
        RunnerConfig(**settings)  # type: ignore[arg-type]


def test_step_input_checks_rows() -> None:
    with pytest.raises(ValueError, match="no rows"):
        StepInput("r", [], None)
    with pytest.raises(ValueError, match=r"\(2, 4\) does not match 3 rows"):
        StepInput("r", [1, 2, 3], torch.zeros(2, 4))
    assert StepInput("r", [1, 2], torch.zeros(2, 4)).num_rows == 2
