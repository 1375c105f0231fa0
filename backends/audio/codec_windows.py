"""Talker -> Code2Wav bridge: cut a request's codec frames into Code2Wav windows.

One `CodecWindowBridge` per Talker request (per external request id). Windows are 3
left-context codes followed by the new frames: the left context is 3 silence codes at the
start of a stream and the last 3 codes of the previous window afterwards, so a steady window is
28 codes and Code2Wav decodes 25 of them (the last 3 are its look-ahead, decoded in the next
window). Sequence numbers `chunk_seq` count 0, 1, 2, ... within one `cache_epoch`; a turn end
closes the epoch and the next turn starts a new one with fresh left context.
Pure Python on purpose: it runs on the Talker's output path, away from any device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.models.speech_codes import SILENCE_CODE


@dataclass(frozen=True, slots=True)
class CodecWindowConfig:
    chunk_frames: int = 25  # new frames per steady window (1 s at 25 Hz)
    left_context_frames: int = 3  # equals Code2Wav's look-ahead (pre_lookahead_len)
    min_body_frames: int = 5  # a unit-end flush below this is held for the next unit
    silence_code: int = SILENCE_CODE

    def __post_init__(self) -> None:
        if self.chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {self.chunk_frames}")
        if self.left_context_frames < 0:
            raise ValueError(f"left_context_frames must be >= 0, got {self.left_context_frames}")
        if not 1 <= self.min_body_frames <= self.chunk_frames:
            raise ValueError(
                f"min_body_frames must be in [1, chunk_frames={self.chunk_frames}], "
                f"got {self.min_body_frames}"
            )


@dataclass(frozen=True, slots=True)
class CodecWindow:
    cache_epoch: int
    chunk_seq: int  # 0, 1, 2, ... within cache_epoch
    codes: tuple[int, ...]  # left context followed by the new frames
    num_left_context: int
    last_chunk: bool  # closes the epoch: Code2Wav flushes its held tail and drops its state
    unit_end: bool  # the window ends a Talker unit (segment); upstream's tts_is_last_chunk

    @property
    def num_new_frames(self) -> int:
        return len(self.codes) - self.num_left_context


@dataclass(slots=True)
class CodecWindowBridge:
    """Accumulates one request's codec frames and emits windows; not thread-safe (one owner)."""

    config: CodecWindowConfig = field(default_factory=CodecWindowConfig)
    cache_epoch: int = 0
    _pending: list[int] = field(init=False, default_factory=list)
    _left_context: list[int] = field(init=False, default_factory=list)
    _next_seq: int = field(init=False, default=0)
    _has_epoch_data: bool = field(init=False, default=False)  # a frame reached this epoch

    def __post_init__(self) -> None:
        if self.cache_epoch < 0:
            raise ValueError(f"cache_epoch must be >= 0, got {self.cache_epoch}")
        self._reset_stream()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @property
    def next_chunk_seq(self) -> int:
        return self._next_seq

    def push(self, frames: list[int]) -> list[CodecWindow]:
        """Add sampled frames (EOS never included); return every full window now ready."""
        self._pending.extend(frames)
        self._has_epoch_data = self._has_epoch_data or bool(frames)
        windows = []
        while len(self._pending) >= self.config.chunk_frames:
            windows.append(self._emit(self.config.chunk_frames, last_chunk=False, unit_end=False))
        return windows

    def end_unit(self) -> list[CodecWindow]:
        """Non-terminal flush at a Talker unit end: keep Code2Wav's caches alive.

        1..min_body_frames-1 pending frames are held and merged into the next unit (a window
        that short would emit almost nothing and Code2Wav needs more than its look-ahead).
        """
        num = len(self._pending)
        if num < self.config.min_body_frames:
            return []
        return [self._emit(num, last_chunk=False, unit_end=True)]

    def end_turn(self) -> list[CodecWindow]:
        """Terminal flush: send everything with last_chunk, then open the next epoch.

        With nothing pending, the window is the left context alone, which drains Code2Wav's
        look-ahead. A second call for the same turn (or a turn that never produced a frame)
        sends nothing: replaying a terminal window would repeat audio (edge case 4).
        """
        if not self._has_epoch_data:
            return []
        window = self._emit(len(self._pending), last_chunk=True, unit_end=True)
        self.start_new_epoch()
        return [window]

    def start_new_epoch(self) -> None:
        """Drop pending frames and start a fresh stream under the next cache_epoch (turn end,
        barge-in, or a new internal request behind the same external id)."""
        self.cache_epoch += 1
        self._reset_stream()

    def _reset_stream(self) -> None:
        self._pending = []
        self._left_context = [self.config.silence_code] * self.config.left_context_frames
        self._next_seq = 0
        self._has_epoch_data = False

    def _emit(self, num_new: int, last_chunk: bool, unit_end: bool) -> CodecWindow:
        codes = self._left_context + self._pending[:num_new]
        del self._pending[:num_new]
        window = CodecWindow(
            cache_epoch=self.cache_epoch,
            chunk_seq=self._next_seq,
            codes=tuple(codes),
            num_left_context=len(self._left_context),
            last_chunk=last_chunk,
            unit_end=unit_end,
        )
        self._next_seq += 1
        num_context = self.config.left_context_frames
        self._left_context = codes[len(codes) - num_context :] if num_context else []
        return window
