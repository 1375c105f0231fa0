"""The Thinker's context window per session: which units stay in KV
(docs/model_facts.md#context-window).

Modes (chosen per session at START, immutable afterwards):
- `off` (default, the released checkpoint's behaviour): the session grows until its reserved
  context is full, then ends with `context_length_exceeded`.
- `basic`: in-place re-anchoring on the runner (the newer upstream design, without re-prefill).
  When an append plus a unit's decode would take the KV past the high watermark, the oldest
  whole units are dropped so it lands at (or as near as possible above) the low watermark. A
  unit starts at the rows that open it in its append (the re-injected terminator and
  `</unit>`, as the upstream unit records count them), or at its `<unit>` row in a first
  append. The kept prefix (the attention sink) is exactly the system context, as upstream
  keeps it; the runner moves the kept rows down to right after it, wherever it ends. A session that
  reaches its reserved context with nothing left to drop ends with `context_length_exceeded`.
  Deeper layers keep the context their K/V was computed with (StreamingLLM semantics).
- `context`: at most `max_units` units stay; the sampled text of dropped units accumulates
  (at most `previous_max_tokens` tokens, newest kept) and is shown after the instructions
  behind "\\n\\nprevious: ". That text must sit before the retained units, which in-place
  re-anchoring cannot do, so this mode re-prefills: the session's KV is replaced by the rebuilt
  prompt (the 0.30.0 replacement-prompt behaviour) whenever a unit is dropped.

Sampling positions repeat after a cut or a re-prefill; `position_offset` (added to the RoPE
position when the policy seeds its draws) keeps the session's random stream from repeating.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from backends.thinker.prompt_layout import AppendRows

WINDOW_OFF = "off"
WINDOW_BASIC = "basic"
WINDOW_CONTEXT = "context"
WINDOW_MODES = (WINDOW_OFF, WINDOW_BASIC, WINDOW_CONTEXT)


# The official marks leave this much of a 4096-token context free above the high mark: room
# for the append that crosses it.
MARK_HEADROOM_TOKENS = 96


@dataclass(frozen=True, slots=True)
class WindowConfig:
    """The official duplex model's defaults (MiniCPMODuplex's `basic_window_*_tokens`,
    `context_*`; its DuplexWindowConfig dataclass says 8000 / 6000, which that model overrides)."""

    high_tokens: int = 4000  # basic: projected KV above this triggers a cut
    low_tokens: int = 3500  # basic: a cut aims to land at or below this
    previous_max_tokens: int = 500  # context: dropped text kept, newest first
    max_units: int = 24  # context: units kept in the prompt

    def __post_init__(self) -> None:
        if not 0 < self.low_tokens < self.high_tokens:
            raise ValueError(
                f"window watermarks need 0 < low < high, got low {self.low_tokens}, "
                f"high {self.high_tokens}"
            )
        if self.previous_max_tokens < 0 or self.max_units < 1:
            raise ValueError(
                f"previous_max_tokens must be >= 0 and max_units >= 1, got "
                f"{self.previous_max_tokens}, {self.max_units}"
            )


@dataclass(frozen=True, slots=True)
class Cut:
    """Arguments of `ModelRunner.reanchor`."""

    keep_prefix: int
    drop: int


@dataclass(slots=True)
class UnitRecord:
    start: int  # KV index of the unit's <unit> row
    head: int  # rows just before it that open it (re-injected terminator, </unit>)
    embeds: torch.Tensor | None  # [10, hidden] audio embeddings; kept in `context` mode only
    tokens: tuple[int, ...] = ()  # sampled after it (none after an append's inner units)


class ContextWindow:
    """The units now in one session's KV and the window decisions over them."""

    def __init__(self, mode: str, config: WindowConfig, max_len: int) -> None:
        if mode not in WINDOW_MODES:
            raise ValueError(f"sliding_window_mode {mode!r} is not one of {list(WINDOW_MODES)}")
        self.mode = mode
        self.config = config
        # A smaller context (a session's max_kv_tokens) scales both marks, keeping their gaps in
        # proportion: marks at the context itself would cut (and re-rotate the KV) every unit.
        scale = min(1.0, max_len / (config.high_tokens + MARK_HEADROOM_TOKENS))
        self.high = int(config.high_tokens * scale)
        self.low = int(config.low_tokens * scale)
        self.units: list[UnitRecord] = []
        self.prefix_len: int | None = None  # system context rows (known after the first append)
        self.previous: deque[int] = deque(maxlen=config.previous_max_tokens)
        self.position_offset = 0  # positions given up by cuts and re-prefills so far

    @property
    def keeps_embeds(self) -> bool:
        return self.mode == WINDOW_CONTEXT

    def on_prefill(
        self,
        first_position: int,
        rows: AppendRows,
        new_embeds: Sequence[torch.Tensor],  # each [10, hidden]
    ) -> None:
        """An append's rows entered KV at `first_position`. A rebuilt prompt lays out the
        retained units again before the new ones, so they get new starts."""
        starts = [first_position + offset for offset in rows.unit_offsets]
        retained = len(starts) - len(new_embeds)
        if retained != (len(self.units) if rows.restarts else 0) or rows.num_units != len(
            new_embeds
        ):
            raise ValueError(
                f"{len(starts)} laid-out units do not match {len(new_embeds)} new and "
                f"{len(self.units)} retained units (restarts={rows.restarts})"
            )
        if self.prefix_len is None or rows.restarts:
            self.prefix_len = starts[0]
        for record, start, head in zip(self.units[:retained], starts, rows.unit_heads):
            record.start, record.head = start, head
        for index in range(retained, len(starts)):
            embeds = new_embeds[index - retained] if self.keeps_embeds else None
            self.units.append(UnitRecord(starts[index], rows.unit_heads[index], embeds))

    def on_decision(self, tokens: Sequence[int]) -> None:
        """The tokens sampled after the newest unit (terminator included)."""
        if not self.units:
            raise ValueError("a decision arrived before any unit")
        self.units[-1].tokens = tuple(tokens)

    # ---- basic: in-place cuts --------------------------------------------------------------

    def plan_cut(self, num_tokens: int, incoming: int) -> Cut | None:
        """The cut to make before `incoming` more rows join `num_tokens`, or None."""
        if self.mode != WINDOW_BASIC or self.prefix_len is None:
            return None
        projected = num_tokens + incoming
        if projected <= self.high:
            return None
        sink = self.prefix_len  # the system context stays, exactly as the official window keeps it
        starts = [u.start - u.head for u in self.units if u.start - u.head > sink]
        if not starts:
            return None
        landing = [s for s in starts if projected - (s - sink) <= self.low]
        cut_at = landing[0] if landing else starts[-1]
        return Cut(keep_prefix=sink, drop=cut_at - sink)

    def apply_cut(self, cut: Cut) -> None:
        """Forget the units the runner dropped; shift the kept ones down."""
        end = cut.keep_prefix + cut.drop
        self.units = [u for u in self.units if u.start >= end]
        for unit in self.units:
            unit.head = min(unit.head, unit.start - end)  # a cut at <unit> drops its head rows
            unit.start -= cut.drop
        self.position_offset += cut.drop

    # ---- context: drops with re-prefill ----------------------------------------------------

    def units_to_drop(self, num_new_units: int) -> int:
        """How many of the oldest units a `context` session drops before this append."""
        if self.mode != WINDOW_CONTEXT:
            return 0
        excess = len(self.units) + num_new_units - self.config.max_units
        return min(max(excess, 0), len(self.units))

    def drop_oldest(self, count: int, special_ids: Collection[int]) -> None:
        """Drop `count` units; their non-special sampled tokens join the previous text."""
        for unit in self.units[:count]:
            self.previous.extend(t for t in unit.tokens if t not in special_ids)
        del self.units[:count]

    def history(self) -> list[tuple[torch.Tensor, tuple[int, ...]]]:
        """(embeds [10, hidden], tokens) of every retained unit, oldest first."""
        if not self.keeps_embeds:
            raise ValueError(f"a {self.mode!r} window keeps no unit embeddings")
        return [(u.embeds, u.tokens) for u in self.units if u.embeds is not None]

    def on_restart(self, num_tokens: int) -> None:
        """The session's KV of `num_tokens` rows was discarded for a rebuilt prompt."""
        self.position_offset += num_tokens
