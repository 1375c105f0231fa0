"""ContextWindow: unit bookkeeping and the window decisions of
docs/model_facts.md#context-window.

Strategy: the window is fed AppendRows laid out by the real PromptLayout (so unit offsets and
heads are the engine's) at chosen KV positions, then asked for cuts and drops; every expected
cut is worked out by hand in the test from page size, sink and watermarks.
"""

from __future__ import annotations

import pytest
import torch

from backends.checkpoint.tokenizer import SpecialTokens, TextTokenizer
from backends.thinker.context_window import (
    WINDOW_BASIC,
    WINDOW_CONTEXT,
    WINDOW_OFF,
    ContextWindow,
    Cut,
    UnitRecord,
    WindowConfig,
)
from backends.thinker.prompt_layout import PromptLayout

HIDDEN = 4


def _embeds(count: int) -> list[torch.Tensor]:
    return [torch.full((10, HIDDEN), float(i)) for i in range(count)]


def _window(mode: str = WINDOW_BASIC, **cfg: int) -> ContextWindow:
    config = WindowConfig(**{"high_tokens": 200, "low_tokens": 100, **cfg})
    return ContextWindow(mode, config, max_len=10_000)


def _with_units(window: ContextWindow, prefix_len: int, units: list[tuple[int, int]]) -> None:
    """Set the window's state directly: (start, head) per unit."""
    window.prefix_len = prefix_len
    window.units = [UnitRecord(start, head, None) for start, head in units]


@pytest.mark.parametrize(("cfg", "match"), [
    ({"low_tokens": 300, "high_tokens": 200}, "0 < low < high"),
    ({"low_tokens": 0}, "0 < low < high"),
    ({"max_units": 0}, "max_units"),
    ({"previous_max_tokens": -1}, "previous_max_tokens"),
])
def test_config_is_validated(cfg: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WindowConfig(**cfg)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="'sliding' is not one of"):
        ContextWindow("sliding", WindowConfig(), 8192)


def test_the_official_marks_hold_at_a_4096_token_context_and_scale_below_it() -> None:
    """4000 / 3500 as the official duplex model sets them; a smaller context keeps their
    proportions, so a full session does not cut at every unit."""
    for max_len in (4096, 8192):
        window = ContextWindow(WINDOW_BASIC, WindowConfig(), max_len=max_len)
        assert (window.high, window.low) == (4000, 3500)
    window = ContextWindow(WINDOW_BASIC, WindowConfig(), max_len=1024)
    assert (window.high, window.low) == (1000, 875)


def test_prefill_records_unit_starts_and_heads(
    tokenizer: TextTokenizer, special: SpecialTokens
) -> None:
    layout, window = PromptLayout(tokenizer, special), _window()
    first = layout.append(_embeds(1), context=layout.system_context())
    window.on_prefill(0, first, _embeds(1))
    context_len = first.unit_offsets[0]
    assert window.prefix_len == context_len and first.token_ids[context_len] == special.unit
    later = layout.append(_embeds(2), terminator=special.listen)
    window.on_decision([special.listen])
    window.on_prefill(100, later, _embeds(2))
    assert [(u.start, u.head) for u in window.units] == [(context_len, 0), (102, 2), (114, 1)]
    assert [later.token_ids[u.start - 100] for u in window.units[1:]] == [special.unit] * 2
    assert window.units[0].tokens == (special.listen,) and window.units[0].embeds is None


def test_prefill_refuses_mismatched_units(tokenizer: TextTokenizer, special: SpecialTokens) -> None:
    layout, window = PromptLayout(tokenizer, special), _window()
    rows = layout.append(_embeds(2), context=layout.system_context())
    with pytest.raises(ValueError, match="do not match"):
        window.on_prefill(0, rows, _embeds(1))


def test_no_cut_below_the_high_watermark_or_outside_basic() -> None:
    for mode in (WINDOW_OFF, WINDOW_CONTEXT):
        window = _window(mode)
        _with_units(window, 20, [(20, 0), (64, 2), (96, 2)])
        assert window.plan_cut(190, 30) is None
    window = _window()
    _with_units(window, 20, [(20, 0), (64, 2), (96, 2)])
    assert window.plan_cut(170, 30) is None  # 200 is not above high


def test_cut_lands_at_the_first_unit_start_reaching_low() -> None:
    """The sink is the system context itself (20 rows, not rounded to a page). Projected 230:
    landing <= 100 needs a drop >= 130, so the cut end must be >= 150: 148 (the unit at 150
    opens with 2 head rows) is short of it, 163 is the first unit start that reaches it."""
    window = _window()
    _with_units(window, 20, [(20, 0), (48, 2), (113, 2), (150, 2), (165, 2), (210, 2)])
    assert window.plan_cut(200, 30) == Cut(keep_prefix=20, drop=143)


def test_cut_falls_back_to_the_last_unit_start() -> None:
    """No start lands at low: take the most that can be dropped (end 148 = 150 - 2)."""
    window = _window()
    _with_units(window, 20, [(20, 0), (48, 2), (114, 2), (150, 2)])
    assert window.plan_cut(300, 30) == Cut(keep_prefix=20, drop=128)


def test_nothing_after_the_sink_means_no_cut() -> None:
    window = _window()
    _with_units(window, 20, [(20, 0)])
    assert window.plan_cut(300, 30) is None  # the first unit starts at the sink: nothing to drop
    _with_units(window, 20, [(20, 0), (23, 2)])
    assert window.plan_cut(300, 30) == Cut(keep_prefix=20, drop=1)  # any row past the sink can go


def test_apply_cut_forgets_dropped_units_and_shifts_the_rest() -> None:
    window = _window()
    _with_units(window, 20, [(20, 0), (48, 2), (113, 2), (178, 2), (210, 2)])
    window.apply_cut(Cut(keep_prefix=32, drop=144))
    assert [(u.start, u.head) for u in window.units] == [(34, 2), (66, 2)]
    assert window.position_offset == 144
    window.apply_cut(Cut(keep_prefix=32, drop=34))  # at a <unit> row: its head rows go too
    assert [(u.start, u.head) for u in window.units] == [(32, 0)]
    assert window.position_offset == 178


def test_context_mode_drops_down_to_max_units(special: SpecialTokens) -> None:
    window = _window(WINDOW_CONTEXT, max_units=3, previous_max_tokens=4)
    window.units = [
        UnitRecord(10 * i, 2, torch.zeros(10, HIDDEN), (special.speak, 300 + i, special.chunk_eos))
        for i in range(3)
    ]
    assert window.units_to_drop(1) == 1 and window.units_to_drop(5) == 3
    specials = {special.speak, special.chunk_eos}
    window.drop_oldest(2, specials)
    assert list(window.previous) == [300, 301] and len(window.units) == 1
    window.units += [UnitRecord(0, 2, torch.zeros(10, HIDDEN), t) for t in ((310, 311), (312,))]
    window.drop_oldest(2, specials)
    assert list(window.previous) == [301, 302, 310, 311]  # the newest 4 are kept
    assert [tokens for _, tokens in window.history()] == [(312,)]


def test_other_modes_keep_no_history() -> None:
    window = _window(WINDOW_BASIC)
    assert window.units_to_drop(100) == 0
    with pytest.raises(ValueError, match="keeps no unit embeddings"):
        window.history()


def test_restart_reassigns_starts(tokenizer: TextTokenizer, special: SpecialTokens) -> None:
    layout = PromptLayout(tokenizer, special)
    window = _window(WINDOW_CONTEXT, max_units=2)
    window.on_prefill(0, layout.append(_embeds(1), context=layout.system_context()), _embeds(1))
    window.on_decision([special.speak, 300, special.chunk_eos])
    window.on_prefill(40, layout.append(_embeds(1), terminator=special.chunk_eos), _embeds(1))
    window.on_decision([special.listen])
    assert window.units_to_drop(1) == 1
    window.drop_oldest(1, {special.speak, special.chunk_eos})
    system = layout.system_context(previous_ids=tuple(window.previous))
    rows = layout.rebuild(system, window.history(), _embeds(1))
    window.on_restart(60)
    window.on_prefill(0, rows, _embeds(1))
    ids = rows.token_ids
    assert [ids[u.start] for u in window.units] == [special.unit] * 2
    assert window.prefix_len == rows.unit_offsets[0] and window.position_offset == 60
