"""Re-anchoring helpers: cut validation messages (the KV math is tested through ModelRunner
in test_model_runner.py against fresh prefills).

Strategy: literal bad cuts, each must name the offending values.
"""

from __future__ import annotations

import pytest

from backends.runner.reanchor import check_reanchor


@pytest.mark.parametrize(
    "keep,drop,match",
    [(-4, 4, "non-negative"), (4, -1, "non-negative"), (8, 8, "exceeds the 12")],
)
def test_bad_cuts_are_named(keep: int, drop: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_reanchor("r", keep, drop, num_computed=12)
    for keep, drop in ((4, 8), (4, 7), (3, 9), (0, 12)):  # valid cuts pass, wherever they end
        check_reanchor("r", keep, drop, num_computed=12)
