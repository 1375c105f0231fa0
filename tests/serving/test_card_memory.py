"""A planned profile on a smaller GPU is refused before anything starts, naming what would fit."""
from __future__ import annotations

import pytest

from backends.serving.card_memory import card_memory_gib, check_card

H100_AND_H200 = "0, 81559\n1, 143771\n"


def test_card_memory_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert card_memory_gib(0, H100_AND_H200) == pytest.approx(79.65, abs=0.01)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert card_memory_gib(0, H100_AND_H200) == pytest.approx(140.4, abs=0.1)
    assert card_memory_gib(1, H100_AND_H200) is None


def test_a_smaller_card_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match=r"139\.8 GiB and this one has 79\.6 GiB: add `--set gpu_memory_gib=79\.6`"):
        check_card("gpu-h200", 139.8, 79.6)


@pytest.mark.parametrize("card", [None, 139.3, 143.0])
def test_the_planned_card_or_an_unknown_one_passes(card):
    check_card("gpu-h200", 139.8, card)


def test_the_launcher_refuses_gpu_h200_on_an_80_gb_card(monkeypatch, capsys):
    from backends.serving import launcher

    monkeypatch.setattr(launcher, "card_memory_gib", lambda gpu: 79.2)
    assert launcher.main(["--profile", "gpu-h200", "--render-only", "/nonexistent"]) == 2
    assert "gpu-h200 is planned for a GPU of 139.8 GiB" in capsys.readouterr().err
