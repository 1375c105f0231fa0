"""The suite's `interpreter` mark (tests/interpreter_mark.py): such tests skip where Triton's
interpreter is off, unless they are also marked `gpu`."""
from __future__ import annotations

import pytest
from interpreter_mark import skip_where_the_interpreter_is_off


class FakeItem:
    def __init__(self, *marks: str) -> None:
        self.marks, self.added = set(marks), []

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None

    def add_marker(self, marker: object) -> None:
        self.added.append(marker)


@pytest.mark.parametrize(("interpret", "skipped"), [("1", []), ("0", ["cpu"]), (None, ["cpu"])])
def test_only_interpreter_tests_without_gpu_skip_where_it_is_off(
    monkeypatch, interpret, skipped,
) -> None:
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    items = {"cpu": FakeItem("interpreter"), "both": FakeItem("interpreter", "gpu"),
             "plain": FakeItem(), "gpu": FakeItem("gpu")}
    skip_where_the_interpreter_is_off(items.values())  # type: ignore[arg-type]
    assert [name for name, item in items.items() if item.added] == skipped
    for name in skipped:
        assert items[name].added[0].kwargs["reason"].startswith("CPU tensors through Triton")
